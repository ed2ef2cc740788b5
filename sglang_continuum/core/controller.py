"""The Continuum controller: the engine-agnostic state machine behind the scheduler adapter.

It is driven by five events (turn arrived, turn admitted, turn finished, turn aborted, scheduler
step) and answers with pins to create or release. Engine objects appear only as opaque handles.

With a host tier (HiCache) a second pin table holds host pins: a device pin that expires or is
shed before its program returns is offloaded (``offload``) and its host copy protected for a host
TTL; host pins end like device pins (next turn admitted, last step, abort, expiry, budget), and
optionally schedule a predictive reload shortly before the tool's predicted return.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from sglang_continuum.core import cost_model  # noqa: F401  (registers the "cost" and "bernstein" models)
from sglang_continuum.core.clock import Clock
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.offload import ReloadCost, predicted_return
from sglang_continuum.core.pins import Pin, PinTable
from sglang_continuum.core.programs import ProgramRegistry
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_stats import UNKNOWN_TOOL, ToolStats
from sglang_continuum.core.ttl import TTL_MODELS, TTLModel, TTLQuery

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TurnTag:
    """What the adapter stores on a request when it arrives."""

    meta: ProgramMeta
    request_seq: int
    program_seq: int  # == request_seq for requests without a program
    arrival: float = 0.0
    returning_miss: bool = False  # a later turn whose program held no pin when it arrived


@dataclass(slots=True)
class PinCounters:
    created: int = 0
    hits: int = 0  # the next turn was admitted while the pin held its prefix
    expired: int = 0
    shed: int = 0  # released early to make room (budget or memory pressure)
    refused: int = 0  # not created: over budget and latest arrival
    released: int = 0  # last step, abort, retraction, replaced


@dataclass(slots=True)
class HostCounters:
    offloaded: int = 0  # device pins whose prefix went to a protected host copy
    offload_failed: int = 0  # no host copy could be made (host pool full of protected copies)
    host_hits: int = 0  # returning turns that loaded their prefix back from host
    host_hit_tokens: int = 0  # tokens loaded back instead of recomputed
    host_expired: int = 0
    host_released: int = 0  # next turn admitted, last step, abort, budget
    reloads_started: int = 0  # predictive reloads
    reloads_used: int = 0  # the returning turn found the reloaded prefix on the device
    reloads_wasted: int = 0  # evicted again before the turn came, or the program never came back


@dataclass(slots=True)
class FinishOutcome:
    pin: Optional[Pin] = None
    release: list[Pin] = field(default_factory=list)
    ttl: Optional[float] = None


class ContinuumController:
    def __init__(
        self,
        settings: ContinuumSettings,
        *,
        clock: Clock,
        budget_tokens: int = 0,
        ttl_model: Optional[TTLModel] = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.programs = ProgramRegistry(
            max_programs=settings.max_programs, idle_timeout_s=settings.program_idle_timeout_s
        )
        self.stats = ToolStats(
            window=settings.tool_window, global_window=settings.global_window, max_tools=settings.max_tools
        )
        self.pins = PinTable(budget_tokens)
        self.counters = PinCounters()
        self.host_pins = PinTable(0)  # empty budget until attach_host_tier
        self.host_counters = HostCounters()
        self.reload_cost: Optional[ReloadCost] = None
        self._reload_heap: list[tuple[float, int, Pin]] = []  # (start time, seq, host pin)
        self._reloading: dict[str, int] = {}  # program -> tokens reloaded, until its turn is admitted
        self.ttl_model: TTLModel = ttl_model or TTL_MODELS[settings.ttl_model](
            settings=settings, stats=self.stats, clock=clock
        )
        self._seq = itertools.count(1)

    def attach_host_tier(self, *, reload: ReloadCost, host_budget_tokens: int, hold_cost: float) -> None:
        """HiCache is on: misses reload instead of recomputing, and host pins may hold
        ``host_budget_tokens`` of the host pool."""
        self.reload_cost = reload
        self.host_pins = PinTable(host_budget_tokens)
        use = getattr(self.ttl_model, "use_host_tier", None)
        if use is not None:
            use(reload, hold_cost)

    # -- events --------------------------------------------------------------------------
    def turn_arrived(self, meta: ProgramMeta) -> TurnTag:
        seq = next(self._seq)
        now = self.clock()
        if not meta.has_program:
            return TurnTag(meta, seq, seq, now)
        state, ret = self.programs.turn_arrived(meta.program_id, now, seq)
        if ret is not None:
            self.stats.record(ret.tool, ret.seconds)  # TTL models read tool times from self.stats
        miss = state.turns_arrived > 1 and meta.program_id not in self.pins
        return TurnTag(meta, seq, state.arrival_seq, now, miss)

    def turn_admitted(self, tag: TurnTag) -> Optional[Pin]:
        """The turn was admitted and holds its own lock on its prefix: consume the program's pin
        (a hit)."""
        if not tag.meta.has_program:
            return None
        pin = self.pins.pop(tag.meta.program_id)
        if pin is not None:
            self.counters.hits += 1
            logger.debug("continuum: pin hit program=%s tokens=%d", tag.meta.program_id, pin.tokens)
        return pin

    def turn_started(self, tag: TurnTag, uncached_tokens: int) -> None:
        """The turn's first forward batch has run. For a returning turn that missed its prefix,
        the time since it arrived beyond its own recompute is the delay a hit would have saved
        besides the recompute: waiting in the queue and behind co-scheduled work (T)."""
        if not tag.returning_miss:
            return
        observe = getattr(self.ttl_model, "observe_queue_delay", None)
        if observe is None:
            return
        profile = getattr(self.ttl_model, "profile", None)
        recompute = profile.seconds(uncached_tokens) if profile is not None else 0.0
        observe(max(0.0, self.clock() - tag.arrival - recompute))

    def turn_finished(
        self,
        meta: ProgramMeta,
        *,
        context_tokens: int,
        tool: Optional[str] = None,
        handle: object = None,
    ) -> FinishOutcome:
        """A turn finished and its KV is in the cache. ``handle`` is the engine lock the pin
        would own; if no pin is made the caller releases it (it is in ``release`` or unused)."""
        out = FinishOutcome()
        if not meta.has_program:
            return out
        pid = meta.program_id
        now = self.clock()
        tool = meta.tool_name or tool or UNKNOWN_TOOL
        self.programs.turn_finished(pid, now, tool)
        old = self.pins.pop(pid)  # a concurrent turn of the same program had pinned
        if old is not None:
            self.counters.released += 1
            out.release.append(old)
        out.release.extend(self.drop_host(pid))
        if meta.is_last_step:
            self._settle_reload(pid, used=False)
            state = self.programs.forget(pid)
            observe = getattr(self.ttl_model, "observe_program_end", None)
            if observe is not None and state is not None:
                observe(state.turns_finished)
            logger.debug("continuum: program=%s finished; no pin", pid)
            return out
        if handle is None or context_tokens <= 0:
            return out
        ttl = min(float(self.ttl_model.ttl(TTLQuery(tool, context_tokens))), self.settings.max_ttl_s)
        out.ttl = ttl
        if ttl <= 0:
            logger.debug("continuum: program=%s tool=%s ttl=0; no pin", pid, tool)
            return out
        state = self.programs.get(pid)
        pin = Pin(
            program_id=pid,
            tokens=context_tokens,
            deadline=now + ttl,
            program_arrival=float(state.arrival_seq if state else 0),
            created=now,
            handle=handle,
        )
        released = self.pins.add(pin)
        if pin in released:
            released.remove(pin)
            self.counters.refused += 1
            logger.debug("continuum: program=%s pin refused (budget)", pid)
        else:
            self.counters.created += 1
            out.pin = pin
            logger.debug(
                "continuum: pin program=%s tool=%s ttl=%.3fs tokens=%d", pid, tool, ttl, context_tokens
            )
        self.counters.shed += len(released)
        out.release.extend(released)
        return out

    def turn_aborted(self, meta: ProgramMeta) -> list[Pin]:
        """Abort or retraction: forget the pending tool call and drop the program's pin."""
        if not meta.has_program:
            return []
        self.programs.turn_aborted(meta.program_id, self.clock())
        released = self.drop_host(meta.program_id)
        pin = self.pins.pop(meta.program_id)
        if pin is not None:
            self.counters.released += 1
            released.append(pin)
        return released

    def expire(self, program_waiting: Callable[[str], bool]) -> list[Pin]:
        """Step: pins past their deadline, except those whose program has a turn waiting, which
        are held at most ``max_wait_hold_s`` longer. Also forgets idle programs."""
        now = self.clock()
        expired = self.pins.pop_expired(now, self._wait_hold(program_waiting))
        self.counters.expired += len(expired)
        for pin in expired:
            logger.debug("continuum: pin expired program=%s", pin.program_id)
        for state in self.programs.forget_idle(now):
            dropped = self.pins.pop(state.program_id)
            if dropped is not None:  # cannot happen while idle_timeout > max TTL; stay safe anyway
                expired.append(dropped)
            expired.extend(self.drop_host(state.program_id))
            self._settle_reload(state.program_id, used=False)
        return expired

    def _wait_hold(self, program_waiting: Callable[[str], bool]) -> Callable[[Pin], Optional[float]]:
        """An expired pin whose program has a turn waiting is held ``max_wait_hold_s`` longer."""
        hold_s = self.settings.max_wait_hold_s

        def hold(pin: Pin) -> Optional[float]:
            return pin.deadline + hold_s if hold_s > 0 and program_waiting(pin.program_id) else None

        return hold

    # -- host tier -----------------------------------------------------------------------
    def offload(self, pin: Pin) -> FinishOutcome:
        """A device pin expired or was shed while its program is still out on a tool call:
        decide whether to protect its host copy, and for how long. ``out.pin`` is the new host
        pin (the adapter takes the host lock and sets its handle); ``out.release`` are host pins
        pushed out of the host budget."""
        out = FinishOutcome()
        if self.reload_cost is None or not self.settings.offload_to_host or pin.tier != "device":
            return out
        state = self.programs.get(pin.program_id)
        if state is None or state.last_finish is None:
            return out  # the program is gone
        now = self.clock()
        elapsed = now - state.last_finish
        if state.pending_tool is None:
            # its next turn already arrived and waits (shed under pressure): keep the host copy
            # until that turn is admitted, which releases it
            ttl = self.settings.max_wait_hold_s if state.in_flight > 0 else 0.0
        else:
            host_ttl = getattr(self.ttl_model, "host_ttl", None)
            query = TTLQuery(state.pending_tool, pin.tokens)
            ttl = host_ttl(query, elapsed) if host_ttl is not None else self.settings.host_ttl_s
        ttl = min(float(ttl), self.settings.max_host_ttl_s)
        out.ttl = ttl
        if ttl <= 0:
            return out
        host = Pin(pin.program_id, pin.tokens, now + ttl, pin.program_arrival, now, tier="host")
        released = self.host_pins.add(host)
        if host in released:
            released.remove(host)
        else:
            out.pin = host
            if state.pending_tool is not None:
                self._schedule_reload(host, state.pending_tool, elapsed)
        self.host_counters.host_released += len(released)
        out.release = released
        return out

    def offloaded(self, host: Pin, handle: object) -> None:
        """The host copy for ``host`` (made by ``offload``) is protected by ``handle``."""
        host.handle = handle
        self.host_counters.offloaded += 1

    def offload_failed(self, host: Pin) -> None:
        """No host copy could be protected for ``host`` (made by ``offload``): forget it."""
        if self.host_pins.get(host.program_id) is host:
            self.host_pins.pop(host.program_id)
        self.host_counters.offload_failed += 1

    def drop_host(self, program_id: str) -> list[Pin]:
        pin = self.host_pins.pop(program_id)
        if pin is None:
            return []
        self.host_counters.host_released += 1
        return [pin]

    def expire_host(self, program_waiting: Callable[[str], bool]) -> list[Pin]:
        """Host pins past their deadline (held like device pins while a turn of theirs waits)."""
        expired = self.host_pins.pop_expired(self.clock(), self._wait_hold(program_waiting))
        self.host_counters.host_expired += len(expired)
        return expired

    def host_returned(self, tag: TurnTag, loaded_tokens: int, device_prefix_tokens: int) -> list[Pin]:
        """A later turn was admitted: count what came back from host, settle a predictive reload
        (used if its prefix was already on the device), and release the host pin."""
        if not tag.meta.has_program:
            return []
        pid = tag.meta.program_id
        if loaded_tokens > 0:
            self.host_counters.host_hits += 1
            self.host_counters.host_hit_tokens += loaded_tokens
        reloaded = self._reloading.get(pid)
        if reloaded is not None:
            self._settle_reload(pid, used=loaded_tokens == 0 and device_prefix_tokens >= reloaded)
        return self.drop_host(pid)

    def due_reloads(self) -> list[Pin]:
        """Host pins whose predictive reload should start now (each returned once)."""
        now = self.clock()
        due = []
        heap = self._reload_heap
        while heap and heap[0][0] <= now:
            _, _, pin = heapq.heappop(heap)
            if self.host_pins.get(pin.program_id) is pin:
                due.append(pin)
        return due

    def reload_started(self, pin: Pin) -> None:
        self._reloading[pin.program_id] = pin.tokens
        self.host_counters.reloads_started += 1

    def _schedule_reload(self, host: Pin, tool: str, elapsed: float) -> None:
        if not self.settings.predictive_reload:
            return
        window, _ = self.stats.window_for(tool, min_samples=self.settings.cold_start_k + 1)
        if len(window) == 0:
            return
        until = predicted_return(window.sorted, elapsed, self.settings.predictive_reload_quantile)
        lead = self.reload_cost.seconds(host.tokens) + self.settings.predictive_reload_lead_s
        heapq.heappush(self._reload_heap, (host.created + max(0.0, until - lead), next(self._seq), host))
        if len(self._reload_heap) > 2 * len(self.host_pins) + 64:  # drop entries of ended pins
            self._reload_heap = [e for e in self._reload_heap if self.host_pins.get(e[2].program_id) is e[2]]
            heapq.heapify(self._reload_heap)

    def _settle_reload(self, program_id: str, *, used: bool) -> None:
        if self._reloading.pop(program_id, None) is not None:
            if used:
                self.host_counters.reloads_used += 1
            else:
                self.host_counters.reloads_wasted += 1

    def shed_one(self) -> Optional[Pin]:
        pin = self.pins.pop_latest()
        if pin is not None:
            self.counters.shed += 1
            logger.debug("continuum: shed pin program=%s tokens=%d", pin.program_id, pin.tokens)
        return pin

    # -- warm start ----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Tool statistics plus the model's current signals: what warm start saves and loads,
        and what an operator reads to see why TTLs are what they are."""
        model = self.ttl_model
        signals = {}
        if hasattr(model, "queue_delay"):
            signals = {
                "queue_delay_mean_s": model.queue_delay.mean,
                "queue_delay_samples": len(model.queue_delay),
                "eta": model.eta.eta,
                "completed_programs": len(model.eta),
                "program_turns": model.eta.turn_counts(),
            }
        return {
            "ttl_model": self.settings.ttl_model,
            "tool_stats": self.stats.to_dict(),
            "signals": signals,
            "pins": {"live": len(self.pins), "tokens": self.pins.pinned_tokens, "budget": self.pins.budget_tokens},
            "counters": {f: getattr(self.counters, f) for f in PinCounters.__slots__},
            "host_pins": {
                "live": len(self.host_pins), "tokens": self.host_pins.pinned_tokens, "budget": self.host_pins.budget_tokens,
            },
            "host_counters": {f: getattr(self.host_counters, f) for f in HostCounters.__slots__},
        }

    def load_snapshot(self, data: dict) -> None:
        self.stats.load_dict(data["tool_stats"])
        eta = getattr(self.ttl_model, "eta", None)
        for n in data.get("signals", {}).get("program_turns", []) if eta is not None else []:
            eta.add(int(n))
