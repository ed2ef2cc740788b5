"""The Continuum controller: the engine-agnostic state machine behind the scheduler adapter.

It is driven by five events (turn arrived, turn admitted, turn finished, turn aborted, scheduler
step) and answers with pins to create or release. Engine objects appear only as opaque handles.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from sglang_continuum.core import cost_model  # noqa: F401  (registers the "cost" and "bernstein" models)
from sglang_continuum.core.clock import Clock
from sglang_continuum.core.metadata import ProgramMeta
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
        self.ttl_model: TTLModel = ttl_model or TTL_MODELS[settings.ttl_model](
            settings=settings, stats=self.stats, clock=clock
        )
        self._seq = itertools.count(1)

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
        if meta.is_last_step:
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
        pin = self.pins.pop(meta.program_id)
        if pin is None:
            return []
        self.counters.released += 1
        return [pin]

    def expire(self, program_waiting: Callable[[str], bool]) -> list[Pin]:
        """Step: pins past their deadline, except those whose program has a turn waiting, which
        are held at most ``max_wait_hold_s`` longer. Also forgets idle programs."""
        now = self.clock()
        hold_s = self.settings.max_wait_hold_s

        def hold(pin: Pin) -> Optional[float]:
            return pin.deadline + hold_s if hold_s > 0 and program_waiting(pin.program_id) else None

        expired = self.pins.pop_expired(now, hold)
        self.counters.expired += len(expired)
        for pin in expired:
            logger.debug("continuum: pin expired program=%s", pin.program_id)
        for state in self.programs.forget_idle(now):
            dropped = self.pins.pop(state.program_id)
            if dropped is not None:  # cannot happen while idle_timeout > max TTL; stay safe anyway
                expired.append(dropped)
        return expired

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
        }

    def load_snapshot(self, data: dict) -> None:
        self.stats.load_dict(data["tool_stats"])
        eta = getattr(self.ttl_model, "eta", None)
        for n in data.get("signals", {}).get("program_turns", []) if eta is not None else []:
            eta.add(int(n))
