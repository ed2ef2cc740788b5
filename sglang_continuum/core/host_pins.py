"""The host tier's pins (HiCache): which expired or shed device pins get a protected host copy,
for how long, and what each host pin costs the host budget.

A device pin that ends before its program returns is offloaded (``offload``): its host copy is
protected for a host TTL, so the returning turn loads the prefix back instead of recomputing it.
Host pins end like device pins: next turn admitted (``returned``), last step, abort, expiry,
budget. Without a host tier (``attached`` False) nothing here acts.

Pure: the adapter backs the prefix up and takes the host lock (``adapter/host_tier.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from sglang_continuum.core.counters import HostCounters
from sglang_continuum.core.pins import Pin, PinTable, Tier
from sglang_continuum.core.ttl import Reload, TTLModel, TTLQuery
from sglang_continuum.core.turns import FinishOutcome

if TYPE_CHECKING:
    from sglang_continuum.core.programs import ProgramRegistry
    from sglang_continuum.core.rules import Timings


class HostPins:
    def __init__(
        self,
        programs: "ProgramRegistry",
        timings: "Timings",
        clock: Callable[[], float],
        *,
        offload_to_host: bool,
    ) -> None:
        self.programs = programs
        self.timings = timings
        self.clock = clock
        self.offload_to_host = offload_to_host
        self.pins = PinTable(0)  # empty budget until attached
        self.counters = HostCounters()
        self.reload_cost: Optional[Reload] = None

    @property
    def attached(self) -> bool:
        return self.reload_cost is not None

    def attach(self, reload: Reload, budget_tokens: int) -> None:
        """HiCache is on: misses reload instead of recomputing; host pins may hold
        ``budget_tokens`` of the host pool."""
        self.reload_cost = reload
        self.pins = PinTable(budget_tokens)

    def offload(self, pin: Pin, ttl_model: TTLModel) -> FinishOutcome:
        """A device pin expired or was shed while its program is still out on a tool call:
        decide whether to protect its host copy, and for how long. ``out.pin`` is the new host
        pin (the adapter takes the host lock and calls ``offloaded``); ``out.release`` are host
        pins pushed out of the host budget."""
        out = FinishOutcome()
        if not self.attached or not self.offload_to_host or pin.tier is not Tier.DEVICE:
            return out
        state = self.programs.get(pin.program_id)
        if state is None or state.last_finish is None:
            return out  # the program is gone
        now = self.clock()
        if state.pending_tool is None:
            # its next turn already arrived and waits (shed under pressure): keep the host copy
            # until that turn is admitted, which releases it
            ttl = self.timings.max_wait_hold_s if state.in_flight > 0 else 0.0
        else:
            ttl = ttl_model.host_ttl(
                TTLQuery(state.pending_tool, pin.tokens, state.tool_hint_s), now - state.last_finish
            )
        ttl = min(float(ttl), self.timings.max_host_ttl_s)
        out.ttl = ttl
        if ttl <= 0:
            return out
        host = Pin(pin.program_id, pin.tokens, now + ttl, pin.arrival_rank, now, tier=Tier.HOST, scope=pin.scope)
        stored, released = self.pins.add(host)
        if stored:
            out.pin = host
        self.counters.host_released += len(released)
        out.release = released
        return out

    def offloaded(self, host: Pin, handle: object) -> None:
        """The host copy for ``host`` (made by ``offload``) is protected by ``handle``."""
        host.handle = handle
        self.counters.offloaded += 1

    def offload_failed(self, host: Pin) -> None:
        """No host copy could be protected for ``host`` (made by ``offload``): forget it."""
        if self.pins.get(host.program_id) is host:
            self.pins.pop(host.program_id)
        self.counters.offload_failed += 1

    def returned(self, program_id: str, loaded_tokens: int) -> list[Pin]:
        """The program's next turn was admitted: count what came back from host, release the pin."""
        if loaded_tokens > 0:
            self.counters.host_hits += 1
            self.counters.host_hit_tokens += loaded_tokens
            self.counters.load_wait_s += self.reload_cost.seconds(loaded_tokens) if self.reload_cost else 0.0
        return self.drop(program_id)

    def drop(self, program_id: str) -> list[Pin]:
        pin = self.pins.pop(program_id)
        if pin is None:
            return []
        self.counters.host_released += 1
        return [pin]

    def expire(self, now: float, hold: Callable[[Pin], Optional[float]]) -> list[Pin]:
        """Host pins past their host TTL (``hold``: as for device pins, ``PinTable.pop_expired``)."""
        expired = self.pins.pop_expired(now, hold)
        self.counters.host_expired += len(expired)
        return expired

    def clear(self) -> None:
        """The engine dropped its whole cache: host pins go with it."""
        self.counters.host_released += len(self.pins.clear())

    def snapshot(self) -> dict:
        return {"live": len(self.pins), "tokens": self.pins.pinned_tokens, "budget": self.pins.budget_tokens}

    def check_integrity(self, device_pins: PinTable) -> None:
        self.pins.check_integrity()
        for pin in self.pins:
            assert pin.tier is Tier.HOST, "device pin in the host table"
            assert pin.program_id in self.programs, f"host pin outlives its program {pin.program_id}"
            assert pin.program_id not in device_pins, f"{pin.program_id} pinned on device and host at once"
