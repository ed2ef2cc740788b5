"""The Continuum controller: the engine-agnostic state machine behind the scheduler adapter.

It owns every piece of policy state -- the program registry, tool statistics, the device and
host pin tables, the TTL model, the counters -- and is the only code that mutates it. It is
driven by events (turn arrived / admitted / finished / aborted / retracted, scheduler step,
cache reset) and answers with pins to create or release; engine objects appear only as opaque
handles that the adapter locks and unlocks.

With a host tier (HiCache) a second pin table holds host pins: a device pin that expires or is
shed before its program returns is offloaded (``offload``) and its host copy protected for a host
TTL; host pins end like device pins (next turn admitted, last step, abort, expiry, budget).

Which queue order and which TTL model it runs is its ``Rules`` (``core/rules.py``): the product's
by default, a lab variant's by name.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import Callable, Optional

from sglang_continuum.core.admission_control import AdmissionControl
from sglang_continuum.core.bounded_waiting import BoundedWaiting
from sglang_continuum.core.clock import Clock
from sglang_continuum.core.counters import (
    SHED_REASONS,
    AdmissionCounters,
    HostCounters,
    IdentityCounters,
    PinCounters,
    ProgramCounters,
    ShedCounters,
    counter_values,
)
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.offload import ReloadCost
from sglang_continuum.core.pins import Pin, PinTable, Tier
from sglang_continuum.core.priority import Waiting, context_gone
from sglang_continuum.core.programs import HOST_TIER_WORKING_SET_WINDOW_S, ProgramRegistry, ProgramState
from sglang_continuum.core.rules import Rules, resolve_rules
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.silence import Silence
from sglang_continuum.core.stats_exchange import DURATION, OUTCOME, Sample
from sglang_continuum.core.tool_stats import UNKNOWN_TOOL, ToolStats
from sglang_continuum.core.ttl import TTLModel, TTLQuery
from sglang_continuum.core.turns import AdmissionRecord, FinishOutcome, StepPlan, TurnTag

CachedLookup = Optional[Callable[[], Optional[int]]]  # how much of a prompt is cached, looked up on demand
logger = logging.getLogger(__name__)
SURVIVAL_WINDOW = 256  # pin outcomes (hit, or shed and its program came back) pin survival reads


class ContinuumController:
    def __init__(
        self,
        settings: ContinuumSettings,
        *,
        clock: Clock,
        budget_tokens: int = 0,
        rules: Optional[Rules] = None,
    ) -> None:
        self.settings = settings
        self.rules = rules or resolve_rules(settings.rules)
        self.clock = clock
        self.timings = self.rules.timings
        self.timings.check(settings.max_ttl_s)
        self.programs = ProgramRegistry(idle_timeout_s=self.timings.program_idle_timeout_s)
        self.stats = ToolStats()
        self.silence = Silence(self.stats, self.programs)  # programs whose clients announce no ends
        self.pins = PinTable(budget_tokens)
        self.counters = PinCounters()
        self.host_pins = PinTable(0)  # empty budget until attach_host_tier
        self.host_counters = HostCounters()
        self.admission = AdmissionCounters()
        self.sheds = ShedCounters()
        self.program_counters = ProgramCounters()
        self.identity = IdentityCounters()
        self._terminal_tools = frozenset(settings.terminal_tools)
        self.reload_cost: Optional[ReloadCost] = None
        self.ttl_model: TTLModel = self.rules.ttl_model(settings, self.stats)
        self._rank = itertools.count(1)
        # each tool sample recorded here is also handed to this (a StatsExchange's record)
        self.share_sample: Optional[Callable[[str, str, float], None]] = None
        self.last_admission: Optional[AdmissionRecord] = None  # the latest turn_admitted's record
        self._pin_outcomes: deque[bool] = deque(maxlen=SURVIVAL_WINDOW)  # True: a hit
        self._pin_hits = 0  # of them
        self.admission_control = AdmissionControl(settings.admission_control, self.programs, self.admission)
        self.bounded = BoundedWaiting(settings.max_overtakes, self.admission_control.return_loss)

    def attach_host_tier(self, *, reload: ReloadCost, host_budget_tokens: int, hold_cost: float) -> None:
        """HiCache is on: misses reload instead of recomputing, and host pins may hold
        ``host_budget_tokens`` of the host pool."""
        self.reload_cost = reload
        self.host_pins = PinTable(host_budget_tokens)
        self.ttl_model.use_host_tier(reload, hold_cost, self.timings.max_host_ttl_s)
        # a program out on a tool keeps its KV on host, pinned or not: its room is kept longer
        self.programs.working_set_window_s = HOST_TIER_WORKING_SET_WINDOW_S

    # -- events --------------------------------------------------------------------------
    def turn_arrived(
        self, meta: ProgramMeta, *, waiting_ahead: int = 0, prompt_tokens: int = 0, cached_tokens: CachedLookup = None
    ) -> TurnTag:
        """A turn entered the waiting queue behind ``waiting_ahead`` requests. ``cached_tokens``
        looks up how much of its ``prompt_tokens`` is cached (None: unknown), called only for a
        return whose place in the queue order depends on it (``priority.py``)."""
        rank = next(self._rank)
        now = self.clock()
        self.identity.count(meta.identified_by)
        if not meta.has_program:
            tag = TurnTag(meta, rank, rank, now)
            self.bounded.enter(tag, now, waiting_ahead)
            return tag
        if meta.program_id not in self.programs:
            late = self.silence.came_back(meta.program_id, now)
            if late is not None:  # presumed ended, and back after all: the tool took this long
                self.program_counters.presumed_returned += 1
                self._record_tool_sample(DURATION, late[0], late[1])
                self._record_tool_sample(OUTCOME, late[0], 1.0)
        state, ret = self.programs.turn_arrived(meta.program_id, now, rank)
        state.announces_end |= meta.announces_end
        if state.turns_arrived == 1:
            state.first_step = meta.step
            self.program_counters.seen += 1
        if ret is not None:
            self._record_tool_sample(DURATION, ret.tool, ret.seconds)  # TTL models read tool times from self.stats
            self._record_tool_sample(OUTCOME, ret.tool, 1.0)
        if state.pin_shed:  # its pin was shed and it came back: a hit the shed cost
            state.pin_shed = False
            self.sheds.returned += 1
            self._pin_outcome(hit=False)
        miss = state.turns_arrived > 1 and meta.program_id not in self.pins
        tag = TurnTag(meta, rank, state.arrival_rank, now, miss, turn=state.turns_arrived, program=state)
        tag.new_program = state.turns_admitted == 0 and state.turns_finished == 0
        if miss and not tag.new_program and cached_tokens is not None:
            tag.context_gone = context_gone(state.context_tokens, prompt_tokens, cached_tokens())
        self.bounded.enter(tag, now, waiting_ahead)
        return tag

    def turn_requeued(self, tag: TurnTag, *, waiting_ahead: int = 0) -> None:
        """A retracted turn is back in the queue: its wait starts again (time spent running is
        not waiting)."""
        self.bounded.enter(tag, self.clock(), waiting_ahead)

    def turn_admitted(
        self, tag: TurnTag, context_tokens: int, cached_tokens: Optional[int] = None, *, probe: bool = False
    ) -> Optional[Pin]:
        """The turn was admitted and holds its own lock on its prefix: consume the program's pin
        (a hit). A returning turn that missed its prefix (no pin when it arrived, or its pin was
        shed while it waited) contributes its wait (arrival to admission) to T. ``cached_tokens``
        (of its prompt, found cached on device or host; None: not known) feeds the return loss.
        ``probe``: a health probe of SGLang's own, not traffic (an idle server answers one every
        few seconds): it does not move the overtaking clock or its mean prompt."""
        now = self.clock()
        overdue = self.is_overdue(tag)
        pid = tag.meta.program_id if tag.meta.has_program else None
        state = self.programs.get(pid) if pid is not None else None
        if cached_tokens is not None and state is not None and state.turns_admitted > 0:
            self.admission_control.observe_return(state.context_tokens, context_tokens, cached_tokens)
        self.last_admission = AdmissionRecord(
            tag.meta.program_id,
            tag.turn,
            now - tag.queued_at,
            round(self.bounded.overtaken(tag), 2),
            tag.overtake_budget,
            overdue,
            tag.held_back,
            pid is not None and pid in self.pins,
            cached_tokens,
            self.admission_control.return_loss.ratio,
        )
        self.admission.admitted += 1
        if not probe:
            self.bounded.admitted(context_tokens, cached_tokens or 0)
        self.admission.overdue_admitted += overdue
        if pid is None:
            return None
        state = self.programs.turn_admitted(pid, now, context_tokens)
        lost = state is not None and state.pin_lost_waiting
        if lost:
            state.pin_lost_waiting = False
        if tag.returning_miss or lost:
            self.ttl_model.observe_queue_delay(now - tag.arrival)
        pin = self.pins.pop(pid)
        if pin is not None:
            self.counters.hits += 1
            self._pin_outcome(hit=True)
            logger.debug("continuum: pin hit program=%s tokens=%d", pid, pin.tokens)
        return pin

    def turn_finished(
        self,
        meta: ProgramMeta,
        *,
        context_tokens: int,
        tool: Optional[str] = None,
        handle: object = None,
        tag: Optional[TurnTag] = None,
    ) -> FinishOutcome:
        """A turn finished and its KV is in the cache. ``handle`` is the engine lock the pin
        would own; if no pin is made the caller releases it (``out.pin`` is None). ``tag``: the
        turn's own (the adapter passes it): a turn whose program ended since it arrived touches
        nothing of the program seen under that id now."""
        out = FinishOutcome()
        if not meta.has_program:
            return out
        pid = meta.program_id
        if not self._current(meta, tag):
            logger.debug("continuum: straggler turn of ended program=%s; no pin", pid)
            return out
        now = self.clock()
        identified = meta.tool_name or tool
        tool = identified or UNKNOWN_TOOL
        state = self.programs.turn_finished(pid, now, tool, context_tokens)
        out.release.extend(self._drop_pins(pid))  # a concurrent turn of the same program had pinned
        if meta.is_last_step or tool in self._terminal_tools:
            if meta.step is not None:
                affine = state.first_step == 1 and state.turns_arrived >= meta.step
                self.program_counters.affine += affine
                self.program_counters.split += not affine
            self._end_program(self.programs.forget(pid), stranded=False)
            if meta.is_last_step:
                self.program_counters.last_step += 1
            else:
                self.program_counters.terminal_tool += 1
            logger.debug("continuum: program=%s finished (%s); no pin", pid, "last step" if meta.is_last_step else tool)
            return out
        if handle is not None and context_tokens > 0:
            self._pin(out, state, tool, context_tokens, handle, now)
        if out.pin is None and self.reload_cost is None:
            # no room is kept for KV the policy itself lets go; with a host tier the KV waits
            # there, and the program stays in the working set while it is seen
            self.programs.let_go(pid)
        self.silence.went_out(state)
        return out

    def _pin(self, out: FinishOutcome, state: ProgramState, tool: str, context_tokens: int, handle, now: float) -> None:
        """Ask the TTL model how long to keep the finished turn's prefix and pin it for that long
        (``out.pin``; ``out.release``: later programs' pins pushed out of the budget)."""
        pid = state.program_id
        ttl = min(float(self.ttl_model.ttl(TTLQuery(tool, context_tokens))), self.settings.max_ttl_s)
        out.ttl = ttl
        if ttl <= 0:
            logger.debug("continuum: program=%s tool=%s ttl=0; no pin", pid, tool)
            return
        pin = Pin(pid, context_tokens, now + ttl, state.arrival_rank, now, handle=handle)
        while self.pins.pinned_tokens + context_tokens > self.pins.budget_tokens:
            stale = self.silence.stale_pin(now, self.pins, self.programs, keep=pid)
            if stale is None:
                break
            self._count_shed(stale, "stale")  # away past its own pace: it gives the budget up first
            out.release.append(stale)
        stored, released = self.pins.add(pin)
        if stored:
            self.counters.created += 1
            self.silence.pinned(pin, state)
            out.pin = pin
            logger.debug("continuum: pin program=%s tool=%s ttl=%.3fs tokens=%d", pid, tool, ttl, context_tokens)
        else:
            self.counters.refused += 1
            logger.debug("continuum: program=%s pin refused (budget)", pid)
        for victim in released:  # pins of later programs pushed out of the budget
            self._count_shed(victim, "budget")
        out.release.extend(released)

    def turn_aborted(self, meta: ProgramMeta, tag: Optional[TurnTag] = None) -> list[Pin]:
        """Abort: forget the pending tool call and drop the program's pins (``tag``: as for
        ``turn_finished``)."""
        if not meta.has_program or not self._current(meta, tag):
            return []
        self.programs.turn_aborted(meta.program_id, self.clock())
        return self._drop_pins(meta.program_id)

    def end_program(self, program_id: str, *, single_shot: bool = False) -> list[Pin]:
        """The client says the program is over (it may not know its last turn in advance): release
        what it holds and forget it. ``single_shot``: no program after all (``first_turns.py``)."""
        released = self._drop_pins(program_id)
        state = self.programs.forget(program_id, learn=not single_shot)  # a one-shot teaches nothing
        self.program_counters.released += state is not None and not single_shot
        self.program_counters.single_shot += state is not None and single_shot
        self._end_program(None if single_shot else state, stranded=True)
        return released

    def turn_retracted(self, meta: ProgramMeta) -> list[Pin]:
        """Retraction: the turn goes back to the queue; its program's device pin (if any) must
        not hold memory meanwhile. Host copies stay (the turn will want them)."""
        if not meta.has_program:
            return []
        pin = self.pins.pop(meta.program_id)
        if pin is None:
            return []
        self.counters.released += 1
        return [pin]

    def step(self, program_waiting: Callable[[str], bool]) -> StepPlan:
        """Once per scheduler step: pins past their deadline (held at most ``max_wait_hold_s``
        longer while their program has a turn waiting), programs forgotten for idleness (and
        what they held), host pins past their host TTL."""
        now = self.clock()
        plan = StepPlan()
        hold = self._wait_hold(program_waiting)
        plan.expired = self.pins.pop_expired(now, hold)
        self.counters.expired += len(plan.expired)
        if self.reload_cost is None:  # (with a host tier its KV waits there, as above)
            for pin in plan.expired:  # the program did not come back within its TTL
                self.programs.let_go(pin.program_id)
        self.programs.forget_idle(now)
        for state in self.programs.drain_forgotten():
            self.program_counters.forgotten += 1
            self._drop_program(state, plan)
        for state in list(self.silence.due(now, self.programs)):
            pin = self.pins.get(state.program_id)
            if pin is not None:  # the cost model still expects it back: look again when the pin ends
                self.silence.later(state, pin.deadline)
                continue
            self.programs.forget(state.program_id)
            self.program_counters.presumed_ended += 1
            self._drop_program(state, plan)
            self.silence.presumed(state)
        plan.host_expired = self.host_pins.pop_expired(now, hold)
        self.host_counters.host_expired += len(plan.host_expired)
        return plan

    def shed(
        self,
        reason: str,
        *,
        ranked_after: Optional[int] = None,
        keep: Optional[str] = None,
        spare_waiting: Optional[Callable[[str], bool]] = None,
    ) -> Optional[Pin]:
        """The one shed path: release a stale pin (its program, whose client announces no ends,
        stayed away past its own pace: ``silence.py``) if there is one, whatever its rank, else the
        latest-arriving program's pin, optionally only one of a program ranked after
        ``ranked_after``; never ``keep``'s, and none whose program ``spare_waiting`` says has a
        turn waiting. ``reason`` is one of ``SHED_REASONS`` (the counter it goes to; a stale pin
        counts as ``stale``). None when there is none."""
        assert reason in SHED_REASONS, reason
        spare = None if spare_waiting is None else (lambda pin: spare_waiting(pin.program_id))
        pin = self.silence.stale_pin(self.clock(), self.pins, self.programs, keep=keep, spare=spare)
        counted = "stale" if pin is not None else reason
        if pin is None:
            pin = self.pins.pop_latest(ranked_after=ranked_after, keep=keep, spare=spare)
        if pin is not None:
            self._count_shed(pin, counted)
            self.admission.admission_sheds += reason != "alloc"  # for a blocked turn
            logger.debug("continuum: shed pin program=%s tokens=%d (%s)", pin.program_id, pin.tokens, counted)
        return pin

    def _count_shed(self, pin: Pin, reason: str) -> None:
        self.counters.shed += 1
        setattr(self.sheds, reason, getattr(self.sheds, reason) + 1)
        state = self.programs.get(pin.program_id)
        if state is None:
            return
        if state.in_flight > 0:  # its next turn is already waiting: that turn now misses
            self.sheds.while_waiting += 1
            self.sheds.returned += 1
            state.pin_lost_waiting = True
            self._pin_outcome(hit=False)
        else:
            state.pin_shed = True

    def _pin_outcome(self, *, hit: bool) -> None:
        """A pin's program came back to it (``hit``) or after it was shed. The share of hits over
        the latest ``SURVIVAL_WINDOW`` such outcomes (Laplace-smoothed) is the pin survival the cost
        model scales a pin's hit probability by (a pin that is likely shed is worth less); a window,
        so that a new pressure regime moves it within minutes, not hours."""
        window = self._pin_outcomes
        if len(window) == window.maxlen:
            self._pin_hits -= window[0]
        window.append(hit)
        self._pin_hits += hit
        self.ttl_model.pin_survival = (self._pin_hits + 1.0) / (len(window) + 1.0)

    def reset(self) -> None:
        """The engine dropped its whole cache (``/flush_cache``): every pin's node is gone, so
        pins are dropped without unlocking and counted as flushed."""
        self.counters.flushed += len(self.pins.clear())
        self.host_counters.host_released += len(self.host_pins.clear())
        self.admission_control.return_loss.reset()  # the flush, not the load, took those contexts

    # -- queue order and admission -------------------------------------------------------
    def priority_key(self, tag: TurnTag, retracted: bool) -> tuple:
        """The waiting request's key in the rules' order (by default program-level FCFS with
        bounded waiting, ``priority.py``)."""
        pid = tag.meta.program_id
        pinned = pid is not None and pid in self.pins
        ranks = (tag.program_rank, tag.request_rank)
        return self.rules.order(
            Waiting(retracted, self.is_overdue(tag), pinned, *ranks, tag.context_gone, tag.new_program)
        )

    def is_overdue(self, tag: TurnTag) -> bool:
        """Bounded waiting (``core/bounded_waiting.py``): overtaken by its budget of later arrivals."""
        return self.bounded.is_overdue(tag)

    def holds_back(
        self,
        tag: TurnTag,
        request_tokens: int,
        capacity_tokens: int,
        *,
        idle: bool = False,
        pending_tokens: int = 0,
        behind_overdue: bool = False,
    ) -> bool:
        """Program-level admission control (``core/admission_control.py``) for a waiting turn;
        ``idle``: nothing else would run if it waited; ``pending_tokens``: what turns admitted
        earlier in the same prefill selection reserve (``admission_reservation``);
        ``behind_overdue``: an overdue first turn ahead of it is held at the door."""
        return self.admission_control.holds_back(
            tag,
            request_tokens,
            capacity_tokens,
            idle=idle,
            pending_tokens=pending_tokens,
            behind_overdue=behind_overdue,
        )

    def admission_reservation(self, tag: TurnTag, request_tokens: int) -> int:
        """What a turn just added to a prefill selection will reserve in the working set once its
        admission is recorded (``turn_admitted``, after the batch is formed)."""
        return self.admission_control.reservation(tag, request_tokens)

    # -- host tier -----------------------------------------------------------------------
    def offload(self, pin: Pin) -> FinishOutcome:
        """A device pin expired or was shed while its program is still out on a tool call:
        decide whether to protect its host copy, and for how long. ``out.pin`` is the new host
        pin (the adapter takes the host lock and calls ``offloaded``); ``out.release`` are host
        pins pushed out of the host budget."""
        out = FinishOutcome()
        if self.reload_cost is None or not self.settings.offload_to_host or pin.tier is not Tier.DEVICE:
            return out
        state = self.programs.get(pin.program_id)
        if state is None or state.last_finish is None:
            return out  # the program is gone
        now = self.clock()
        elapsed = now - state.last_finish
        if state.pending_tool is None:
            # its next turn already arrived and waits (shed under pressure): keep the host copy
            # until that turn is admitted, which releases it
            ttl = self.timings.max_wait_hold_s if state.in_flight > 0 else 0.0
        else:
            ttl = self.ttl_model.host_ttl(TTLQuery(state.pending_tool, pin.tokens), elapsed)
        ttl = min(float(ttl), self.timings.max_host_ttl_s)
        out.ttl = ttl
        if ttl <= 0:
            return out
        host = Pin(pin.program_id, pin.tokens, now + ttl, pin.arrival_rank, now, tier=Tier.HOST)
        stored, released = self.host_pins.add(host)
        if stored:
            out.pin = host
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

    def host_returned(self, tag: TurnTag, loaded_tokens: int) -> list[Pin]:
        """A later turn was admitted: count what came back from host and release the host pin."""
        if not tag.meta.has_program:
            return []
        if loaded_tokens > 0:
            self.host_counters.host_hits += 1
            self.host_counters.host_hit_tokens += loaded_tokens
        return self._drop_host(tag.meta.program_id)

    # -- warm start ----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Tool statistics plus the model's current signals: what warm start saves and loads,
        and what an operator reads to see why TTLs are what they are."""
        return {
            "rules": self.rules.name,
            "ttl_model": self.ttl_model.name,
            "tool_stats": self.stats.to_dict(),
            "signals": self.ttl_model.signals(),
            "pins": {"live": len(self.pins), "tokens": self.pins.pinned_tokens, "budget": self.pins.budget_tokens},
            "counters": counter_values(self.counters),
            "host_pins": {
                "live": len(self.host_pins),
                "tokens": self.host_pins.pinned_tokens,
                "budget": self.host_pins.budget_tokens,
            },
            "host_counters": counter_values(self.host_counters),
            "admission": counter_values(self.admission),
            "sheds": counter_values(self.sheds),
            "programs": counter_values(self.program_counters),
            "identity": counter_values(self.identity),
        }

    def merge_peer_samples(self, samples: list[Sample]) -> None:
        """Tool samples other workers recorded (``StatsExchange.poll``): into the same windows as
        this worker's own, so the TTL model reads the fleet's distribution. Not shared again."""
        durations: dict[str, list[float]] = {}
        for kind, tool, value in samples:
            if kind == DURATION:
                durations.setdefault(tool, []).append(value)
            else:
                self._apply_tool_sample(kind, tool, value)
        for tool, seconds in durations.items():  # one pass over each sorted window per batch
            self.stats.record_many(tool, seconds)

    def load_snapshot(self, tool_stats: dict, signals: dict) -> None:
        self.stats.load_dict(tool_stats)
        self.ttl_model.load_signals(signals)

    # -- integrity -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Cross-structure invariants; raises AssertionError. Run after every operation in the
        property tests, and at idle while serving with ``SGLANG_CONTINUUM_CHECK_INTEGRITY=1``."""
        self.pins.check_integrity()
        self.host_pins.check_integrity()
        self.programs.check_integrity()
        self.stats.check_integrity()
        self.admission_control.check_integrity()
        self.bounded.check_integrity()
        self.silence.check_integrity()
        for pin in self.pins:
            assert pin.tier is Tier.DEVICE, "host pin in the device table"
            assert pin.program_id in self.programs, f"pin outlives its program {pin.program_id}"
            assert pin.handle is not None, "device pin without an engine lock"
        for pin in self.host_pins:
            assert pin.tier is Tier.HOST, "device pin in the host table"
            assert pin.program_id in self.programs, f"host pin outlives its program {pin.program_id}"
            assert pin.program_id not in self.pins, f"{pin.program_id} pinned on device and host at once"
        c = self.counters
        assert c.hits + c.expired + c.shed + c.released + c.flushed + len(self.pins) == c.created, "pin counters"
        assert self._pin_hits == sum(self._pin_outcomes), "pin survival window"
        d = self.sheds
        assert d.admission + d.idle + d.alloc + d.budget + d.stale == c.shed, "shed counters by rule"
        assert d.while_waiting <= c.shed, "sheds while waiting"

    # -- internals -----------------------------------------------------------------------
    def _current(self, meta: ProgramMeta, tag: Optional[TurnTag]) -> bool:
        """Whether ``tag``'s turn belongs to the program registered under its id now."""
        return tag is None or tag.program is None or self.programs.get(meta.program_id) is tag.program

    def _drop_pins(self, program_id: str) -> list[Pin]:
        """Release whatever the program holds (device pin, host pin)."""
        released = self._drop_host(program_id)
        pin = self.pins.pop(program_id)
        if pin is not None:
            self.counters.released += 1
            released.append(pin)
        return released

    def _drop_host(self, program_id: str) -> list[Pin]:
        pin = self.host_pins.pop(program_id)
        if pin is None:
            return []
        self.host_counters.host_released += 1
        return [pin]

    def _drop_program(self, state: ProgramState, plan: StepPlan) -> None:
        """A program left the registry without a last step: what it held goes, and it ends stranded."""
        plan.released.extend(self._drop_pins(state.program_id))
        self._end_program(state, stranded=True)

    def _end_program(self, state: Optional[ProgramState], *, stranded: bool) -> None:
        """A program ended (last step) or was forgotten: N = its finished turns feeds eta. One
        that ends ``stranded`` (released or forgotten) while out on a tool call tells that the
        tool's programs do not always come back."""
        if state is None:
            return
        if state.turns_finished > 0:
            self.ttl_model.observe_program_end(state.turns_finished)
        if stranded and state.pending_tool is not None and state.in_flight == 0:
            self._record_tool_sample(OUTCOME, state.pending_tool, 0.0)
            self.program_counters.not_returned += 1

    def _record_tool_sample(self, kind: str, tool: str, value: float) -> None:
        self._apply_tool_sample(kind, tool, value)
        if self.share_sample is not None:
            self.share_sample(kind, tool, value)

    def _apply_tool_sample(self, kind: str, tool: str, value: float) -> None:
        if kind == DURATION:
            self.stats.record(tool, value)
        else:
            self.stats.record_outcome(tool, returned=value > 0)

    def _wait_hold(self, program_waiting: Callable[[str], bool]) -> Callable[[Pin], Optional[float]]:
        """An expired pin whose program has a turn waiting is held ``max_wait_hold_s`` longer."""
        hold_s = self.timings.max_wait_hold_s

        def hold(pin: Pin) -> Optional[float]:
            return pin.deadline + hold_s if hold_s > 0 and program_waiting(pin.program_id) else None

        return hold
