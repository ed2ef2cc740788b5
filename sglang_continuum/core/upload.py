"""What a program's tool call lends and brings back (HiCache; Tokencake's time scheduler).

**Lending the gap** (``gap_spare``, its Algorithm 1): a pinned program out on a call long enough for
its prefix to go to host and back with a waiting turn's prefill in between gives its device memory
to that turn, when no pin of a later program could (``adapter/radix_cache.py`` ``shed_for``).

**Predictive upload**: a host pin's prefix loaded back to the device ahead of its
program's predicted return, so the return finds it resident and no load waits on its own path
(Tokencake's time scheduler, its section 4.1; SGLang alone loads a host copy back only once the
return is admitted).

Priced as a pin is (``cost_model.py``): the uploaded prefix is a device pin from now to a deadline
``tau``, chosen as ``argmax P(return within tau | still out after elapsed) * B - price * tau`` over
the call's remaining durations (``forecast.py``: the learned ones, moved by the client's hint), where
``B`` is the load the return would otherwise wait for (the reload cost, learned from the engine's own
loads where no bandwidth was measured) times the tool's return probability, and ``price`` is 1 (a
second of device memory for a second saved) while turns wait, 0 while none does. An upload needs
room: free device memory the waiting turns are not refused, within the pin budget. A call's host
pin is looked at again when its smallest remaining duration comes within ``B``: a certain return
(a hint with no history) uploads exactly the load's time before it. One upload per tool call.

Pure: the adapter loads the prefix back and takes the device lock (``adapter/host_tier.py``).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from sglang_continuum.core.counters import counter_values
from sglang_continuum.core.offload import lends_gap
from sglang_continuum.core.pins import Pin, Tier
from sglang_continuum.core.programs import ProgramRegistry
from sglang_continuum.core.ttl import TTLModel, argmax_sorted

if TYPE_CHECKING:
    from sglang_continuum.core.host_pins import HostPins
    from sglang_continuum.core.pinning import Pinning
    from sglang_continuum.core.settings import ContinuumSettings
    from sglang_continuum.core.shedding import Spare

RECHECK_S = 0.05  # a host pin not uploaded for want of room, or with no time to go by, is looked at again this soon
GAP_PRUNE_AT = 1024  # uploaded tool calls remembered before the ones over are pruned
MAX_CHECKS_PER_STEP = 64  # host pins looked at per step (the rest wait a step): a step's cost is bounded


@dataclass(slots=True)
class UploadCounters:
    started: int = 0  # host copies loaded back (or re-locked, still resident) ahead of their program's return
    used: int = 0  # ... whose program's next turn was admitted while the upload held its prefix
    wasted: int = 0  # ... released (deadline, shed, end) before their program came back
    failed: int = 0  # the engine could not load it back (no load slot, no device room)
    tokens: int = 0  # tokens uploaded


@dataclass(frozen=True, slots=True)
class Upload:
    host: Pin  # the host pin whose prefix goes back to the device
    deadline: float  # the device pin's


class Uploads:
    def __init__(
        self,
        host: "HostPins",
        pinning: "Pinning",
        programs: ProgramRegistry,
        ttl_model: TTLModel,
        settings: "ContinuumSettings",
    ) -> None:
        self.host = host
        self.pinning = pinning
        self.programs = programs
        self.ttl_model = ttl_model
        self.enabled = settings.predictive_upload
        self.max_ttl_s = settings.max_ttl_s
        self.counters = UploadCounters()
        self._checks: list[tuple[float, int, str, Pin]] = []  # (when, seq, program, host pin)
        self._seq = itertools.count()
        self._host_version = -1
        self._live: dict[str, tuple[Pin, int]] = {}  # uploaded device pins: (pin, turns admitted then)
        self._gap: dict[str, float] = {}  # programs uploaded once this tool call: its turn's finish time
        pinning.hands_off = self.wants_host_copy  # a turn let go still goes to host for an upload

    def due(self, now: float, room_tokens: int, *, contended: bool) -> list[Upload]:
        """Host pins to load back now, each with its device pin's deadline. ``room_tokens``: free
        device memory no waiting turn was refused; ``contended``: turns are waiting."""
        self._settle()
        if not self.enabled or not self.host.attached:
            return []
        self._schedule_new(now)
        out: list[Upload] = []
        taken: set[str] = set()
        budget = self.pinning.pins.limit() - self.pinning.pins.pinned_tokens
        for _ in range(MAX_CHECKS_PER_STEP):
            if not self._checks or self._checks[0][0] > now:
                break
            _, _, pid, pin = heapq.heappop(self._checks)
            if self.host.pins.get(pid) is not pin or pid in taken:
                continue  # returned, released or expired since (or looked at twice)
            state = self.programs.get(pid)
            if (
                state is None
                or state.pending_tool is None
                or state.in_flight > 0
                or self._gap.get(pid) == state.last_finish
            ):
                continue  # back already (the admission releases it), or uploaded once this call
            deadline, again = self._price(pin, state, now, contended)
            if deadline is not None and pin.tokens <= min(room_tokens, budget):
                room_tokens -= pin.tokens
                budget -= pin.tokens
                out.append(Upload(pin, deadline))
                taken.add(pid)
            else:
                again = now + RECHECK_S if deadline is not None else again  # it pays, but no room now
                if again is not None and again < pin.deadline:
                    heapq.heappush(self._checks, (again, next(self._seq), pid, pin))
        return out

    def uploaded(self, upload: Upload, handle: object, now: float) -> list[Pin]:
        """The prefix of ``upload`` is on the device (or on its way) under ``handle``: the host pin
        becomes a device pin until the deadline. Returns the pins to release: the host pin, and
        any later programs' pins its budget pushed out."""
        host = upload.host
        state = self.programs.get(host.program_id)
        released = self.host.drop(host.program_id)
        pin = Pin(
            host.program_id, host.tokens, upload.deadline, host.arrival_rank, now, handle=handle, scope=host.scope
        )
        stored, pushed = self.pinning.adopt(pin, state)
        if stored and state is not None:
            self.counters.started += 1
            self.counters.tokens += pin.tokens
            self._live[pin.program_id] = (pin, state.turns_admitted)
            self._gap[pin.program_id] = state.last_finish
            state.pin_shed = False  # the shed that sent it to host cost its return nothing
        return [*released, *pushed] if stored else [*released, *pushed, pin]

    def wants_host_copy(self, state) -> bool:
        """Whether a finished turn the TTL lets go still goes to host through a pin of one step
        (``pinning.HANDOFF_S``): with a host tier and predictive upload, when its client forecast
        its call. Without it, SGLang demotes the prefix only when the pool evicts it, unprotected,
        and no host pin tells an upload where it is."""
        return self.enabled and self.host.attached and state.tool_hint_s is not None

    def failed(self, upload: Upload) -> None:
        self.counters.failed += 1

    def postpone(self, upload: Upload, now: float) -> None:
        """The prefix is still resident: nothing to upload yet (re-locking it would undo the TTL's
        own decision to let it go); looked at again soon, while the host copy lives."""
        if now + RECHECK_S < upload.host.deadline:
            heapq.heappush(self._checks, (now + RECHECK_S, next(self._seq), upload.host.program_id, upload.host))

    def gap_spare(self, request_tokens: int, now: float) -> "Spare":
        """Shedding's rule for a turn of ``request_tokens`` no other pin could make room for: spare
        every pin but those whose program's tool call leaves time to serve it (``offload.lends_gap``):
        such a pin goes to host, and comes back before its return by an upload."""
        model, reload, pins = self.ttl_model, self.host.reload_cost, self.pinning.pins
        if reload is None or not self.enabled:
            return lambda pid: True
        prefill_s = model.prefill_s(request_tokens)

        def spared(pid: str) -> bool:
            state, pin = self.programs.get(pid), pins.get(pid)
            if state is None or pin is None or state.pending_tool is None or state.in_flight > 0:
                return True
            rest = model.forecast.median_remaining(state.pending_tool, state.tool_hint_s, now - state.last_finish)
            return not lends_gap(rest, pin.tokens, prefill_s, reload)

        return spared

    def snapshot(self) -> dict:
        return {"live": len(self._live), "checks": len(self._checks), "counters": counter_values(self.counters)}

    def check_integrity(self) -> None:
        for pid, (pin, _) in self._live.items():
            live = self.pinning.pins.get(pid)
            assert live is None or live is pin or live.created >= pin.created, (
                "an uploaded pin replaced by an older one"
            )
        c = self.counters
        assert c.used + c.wasted + len(self._live) == c.started, "upload counters"
        assert len(self._gap) <= GAP_PRUNE_AT + len(self._live) + len(self.programs), "upload gaps unbounded"

    # -- internals -----------------------------------------------------------------------
    def _price(self, pin: Pin, state, now: float, contended: bool) -> tuple[Optional[float], Optional[float]]:
        """(the device pin's deadline if uploading now pays, else None; when to look again, None: never)."""
        model = self.ttl_model
        elapsed = now - state.last_finish
        rest = model.forecast.remaining(state.pending_tool, state.tool_hint_s, elapsed)
        if rest is None or model.reload is None:
            return None, None  # nothing known of the call: SGLang's reactive load-back
        benefit = model.reload.seconds(pin.tokens) * model.stats.return_probability(state.pending_tool)
        if benefit <= 0:
            return None, None
        cap = min(self.max_ttl_s, max(0.0, pin.deadline - now))  # never past the host copy's own protection
        if not contended:
            keep = min(float(rest[-1]), cap) + benefit  # no turn waits: holding costs nothing yet
        else:
            keep = argmax_sorted(rest, benefit, cap_s=cap)
            keep = keep + benefit if keep > 0 else 0.0  # past the return itself, the load's own time
        if keep > 0:
            return now + keep, None
        if rest[0] > benefit:
            return None, now + max(RECHECK_S, float(rest[0]) - benefit)
        return None, now + RECHECK_S

    def _schedule_new(self, now: float) -> None:
        """Host pins made since the last step get their first look now."""
        table = self.host.pins
        changed = table.changed_since(self._host_version)
        self._host_version = table.version
        candidates = (table.get(pid) for pid in changed) if changed is not None else iter(table)
        for pin in candidates:
            if pin is not None and pin.tier is Tier.HOST and pin.handle is not None:
                heapq.heappush(self._checks, (now, next(self._seq), pin.program_id, pin))
        if len(self._checks) > 4 * max(16, len(table)):  # entries of pins gone: rebuilt, bounded
            self._checks = [e for e in self._checks if table.get(e[2]) is e[3]]
            heapq.heapify(self._checks)

    def _settle(self) -> None:
        """Uploads whose device pin ended since: used if their program's next turn was admitted."""
        pins = self.pinning.pins
        for pid, (pin, admitted) in list(self._live.items()):
            if pins.get(pid) is pin:
                continue
            del self._live[pid]
            state = self.programs.get(pid)
            if state is not None and state.turns_admitted > admitted:
                self.counters.used += 1
            else:
                self.counters.wasted += 1
        if len(self._gap) > GAP_PRUNE_AT + len(self._live):  # bounded: programs gone or back since
            for pid in [
                p for p, at in self._gap.items() if (st := self.programs.get(p)) is None or st.last_finish != at
            ]:
                del self._gap[pid]
