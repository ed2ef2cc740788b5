"""The device pins' room: which finished turn is pinned and for how long, what a new pin pushes
out of the budget, which pin gives its memory back when memory is needed, what expires, and the
counts of all of it.

A finished turn is pinned for the TTL model's time (``ttl.py``), or residency's while the door keeps
its program resident (``residency.py``: such a pin may fill the pins' ceiling, not only their
budget), capped at ``max_ttl_s``. A pin that does not fit pushes out stale pins first, then the pin table
pushes out later programs' pins (``pins.py``). Which pin is shed for a blocked turn is
``shedding.py``'s choice; every shed is counted here by its reason, and a shed pin whose program
comes back (or had already come back) is a miss the cost model's pin survival reads. A turn the
TTL lets go whose prefix an upload should bring back (``upload.py``: a host tier, predictive
upload, the client's forecast of its call) is pinned for ``HANDOFF_S``: its expiry at the next step
offloads the prefix to a protected host copy, which is what an upload loads back. It is made only
in free budget: it never sheds a pin.

Pure: the adapter releases the locks of the pins handed back; the controller routes events here.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

from sglang_continuum.core.counters import PinCounters, ShedCounters
from sglang_continuum.core.door import Door
from sglang_continuum.core.pins import Pin, PinSurvival, PinTable, Tier
from sglang_continuum.core.programs import (
    PIN_EXPIRED,
    PIN_FLUSHED,
    PIN_KEPT,
    PIN_NONE,
    PIN_REFUSED,
    PIN_RELEASED,
    PIN_SHED,
    ProgramRegistry,
    ProgramState,
)
from sglang_continuum.core.shedding import Shedding, Spare
from sglang_continuum.core.silence import Silence
from sglang_continuum.core.ttl import TTLModel, TTLQuery
from sglang_continuum.core.turns import FinishOutcome

logger = logging.getLogger(__name__)
HANDOFF_S = 1e-6  # a pin that expires at the next step, whatever the step's length


class Pinning:
    def __init__(
        self,
        pins: PinTable,
        shedding: Shedding,
        *,
        programs: ProgramRegistry,
        silence: Silence,
        ttl_model: TTLModel,
        door: Door,
        max_ttl_s: float,
    ) -> None:
        self.pins = pins
        self.shedding = shedding
        self.programs = programs
        self.silence = silence
        self.ttl_model = ttl_model
        self.door = door
        self.max_ttl_s = max_ttl_s
        self.counters = PinCounters()
        self.sheds = ShedCounters()
        self.survival = PinSurvival()
        # a finished turn the TTL lets go whose prefix still goes to host (``Uploads.wants_host_copy``)
        self.hands_off: Callable[[ProgramState], bool] = lambda state: False

    def pin(self, out: FinishOutcome, state: ProgramState, tool: str, context_tokens: int, handle, now: float) -> None:
        """Pin the finished turn's prefix for the TTL model's time, or the door's while it keeps the program
        resident, up to the pins' ceiling (``out.pin``; ``out.release``: later programs' pins pushed out)."""
        pid = state.program_id
        resident = self.door.residency.resident_ttl(tool, now, context_tokens)
        out.ttl = ttl = min(
            max(self.ttl_model.ttl(TTLQuery(tool, context_tokens, state.tool_hint_s)), resident), self.max_ttl_s
        )
        state.pin_end = PIN_NONE  # until a pin is stored
        if ttl <= 0 and self.hands_off(state):
            if self.pins.pinned_tokens + context_tokens > self.pins.limit(False):
                # a handoff keeps nothing: it may use free budget, never shed a program's pin for it
                logger.debug("continuum: program=%s no room for a handoff pin", pid)
                return
            ttl = HANDOFF_S  # a pin of one step: its expiry sends the prefix to host for an upload
        elif ttl <= 0:
            logger.debug("continuum: program=%s tool=%s ttl=0; no pin", pid, tool)
            return
        pin = Pin(pid, context_tokens, now + ttl, state.arrival_rank, now, handle=handle, scope=state.scope)
        while self.pins.pinned_tokens + context_tokens > self.pins.limit(resident > 0):
            stale = self.shedding.stale(now, keep=pid)
            if stale is None:
                break
            self.count_shed(stale, "stale")  # away past its own pace: it gives the budget up first
            out.release.append(stale)
        stored, released = self.pins.add(pin, resident=resident > 0)
        if stored:
            state.pin_end = PIN_KEPT
            self.counters.created += 1
            self.silence.pinned(pin, state)
            out.pin = pin
            logger.debug("continuum: pin program=%s tool=%s ttl=%.3fs tokens=%d", pid, tool, ttl, context_tokens)
        else:
            self.counters.refused += 1
            state.pin_end = PIN_REFUSED
            logger.debug("continuum: program=%s pin refused (budget)", pid)
        for victim in released:  # pins of later programs pushed out of the budget
            self.count_shed(victim, "budget")
        out.release.extend(released)

    def adopt(self, pin: Pin, state: Optional[ProgramState]) -> tuple[bool, list[Pin]]:
        """A pin made outside a turn's end (a host copy loaded back ahead of its return,
        ``upload.py``): stored if the budget takes it; the later programs' pins it pushed out."""
        stored, released = self.pins.add(pin)
        for victim in released:
            self.count_shed(victim, "budget")
        if stored:
            self.counters.created += 1
            if state is not None:
                state.pin_end = PIN_KEPT
                self.silence.pinned(pin, state)
        return stored, released

    def consume(self, program_id: str) -> Optional[Pin]:
        """A turn of the program was admitted: its pin, if any, is a hit (the turn holds its own lock now)."""
        pin = self.pins.pop(program_id)
        if pin is not None:
            self.counters.hits += 1
            self.outcome(hit=True)
            logger.debug("continuum: pin hit program=%s tokens=%d", program_id, pin.tokens)
        return pin

    def returned(self, state: ProgramState) -> None:
        """A turn of the program arrived: if its pin was shed while it was out, that was a miss."""
        if state.pin_shed:
            state.pin_shed = False
            self.sheds.returned += 1
            self.outcome(hit=False)

    def release(self, program_id: str) -> Optional[Pin]:
        """Drop the program's pin, if any (its program ended, aborted, or its turn was retracted)."""
        pin = self.pins.pop(program_id)
        if pin is not None:
            self.counters.released += 1
            self._ended(pin, PIN_RELEASED)
        return pin

    def expire(self, now: float, hold: Callable[[Pin], Optional[float]]) -> list[Pin]:
        """Pins past their deadline (``hold``: a later deadline for one whose program has a turn
        waiting), popped: the door keeps no room for their programs any more."""
        expired = self.pins.pop_expired(now, hold)
        self.counters.expired += len(expired)
        for pin in expired:
            state = self._ended(pin, PIN_EXPIRED)
            if state is not None and state.in_flight > 0:  # its turn still waits: its wait is a sample of T
                state.pin_lost_waiting = True
            self.door.kept_nothing(state)  # not back within its TTL
        return expired

    def shed(
        self, reason: str, now: float, *, ranked_after: Optional[int], keep: Optional[str], spares: Sequence[Spare]
    ) -> Optional[Pin]:
        """The pin ``shedding.py`` chooses, popped and counted under ``reason`` (a stale one as ``stale``)."""
        found = self.shedding.victim(now, ranked_after=ranked_after, keep=keep, spares=spares)
        if found is None:
            return None
        pin, stale = found
        self.count_shed(pin, "stale" if stale else reason)
        logger.debug("continuum: shed pin program=%s tokens=%d (%s)", pin.program_id, pin.tokens, reason)
        return pin

    def count_shed(self, pin: Pin, reason: str) -> None:
        self.counters.shed += 1
        setattr(self.sheds, reason, getattr(self.sheds, reason) + 1)
        state = self._ended(pin, PIN_SHED + reason)
        if state is None:
            return
        if state.in_flight > 0:  # its next turn is already waiting: that turn now misses
            self.sheds.while_waiting += 1
            self.sheds.returned += 1
            state.pin_lost_waiting = True
            self.outcome(hit=False)
        else:
            state.pin_shed = True

    def outcome(self, *, hit: bool) -> None:
        """A pin's program came back to it (``hit``) or after it was shed (``PinSurvival``)."""
        self.ttl_model.pin_survival = self.survival.outcome(hit=hit)

    def flushed(self) -> None:
        """The engine dropped its whole cache: every pin goes, unlocked, as flushed."""
        flushed = self.pins.clear()
        self.counters.flushed += len(flushed)
        for pin in flushed:
            self._ended(pin, PIN_FLUSHED)

    def _ended(self, pin: Pin, how: str) -> Optional[ProgramState]:
        """``pin`` ended before its program came back, ``how`` (the program's ``pin_end``)."""
        state = self.programs.get(pin.program_id)
        if state is not None:
            state.pin_end = how
        return state

    def check_integrity(self) -> None:
        self.pins.check_integrity()
        for pin in self.pins:
            assert pin.tier is Tier.DEVICE, "host pin in the device table"
            assert pin.program_id in self.programs, f"pin outlives its program {pin.program_id}"
            assert pin.handle is not None, "device pin without an engine lock"
        c = self.counters
        assert c.hits + c.expired + c.shed + c.released + c.flushed + len(self.pins) == c.created, "pin counters"
        self.survival.check_integrity()
        d = self.sheds
        assert d.admission + d.idle + d.alloc + d.budget + d.stale + d.hold_bound + d.gap == c.shed, (
            "shed counters by rule"
        )
        assert d.while_waiting <= c.shed, "sheds while waiting"
