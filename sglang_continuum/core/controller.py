"""The Continuum controller: the engine-agnostic state machine behind the scheduler adapter.

It holds every piece of policy state -- the program registry, tool statistics, the device and host
pin tables, the TTL model, the counters -- and only it and its rooms mutate it. It is driven by
events (turn arrived / admitted / finished / aborted / retracted, scheduler step, cache reset) and
answers with pins to create or release; engine objects are opaque handles the adapter locks.

Each decision has a room of its own, chosen by the ``Rules`` (``core/rules.py``; the product's by
default, a lab variant's by name): the queue order (``priority.py``), the TTL (``ttl.py``),
residency and the hold bound (``residency.py``), the door and its working set (``door.py``), the
wait bound (``bounded_waiting.py``), which pin to shed (``shedding.py``), the critical paths'
reserve (``critical.py``), the host tier's pins (``host_pins.py``: with HiCache, which device pins
that end before their program returns keep a protected host copy) and what a tool call lends and
brings back (``upload.py``: its device memory to a waiting turn, its prefix before it returns). The device pins' room (``pinning.py``) makes, hands back, expires and counts
pins by those decisions. The controller routes events to the rooms; it and they alone write turn tags.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from typing import Callable, Optional, Sequence

from sglang_continuum.core.clock import Clock
from sglang_continuum.core.counters import (
    SHED_REASONS,
    AdmissionCounters,
    IdentityCounters,
    ProgramCounters,
    counter_values,
)
from sglang_continuum.core.host_pins import HostPins
from sglang_continuum.core.metadata import SOURCE_NONE, ProgramMeta
from sglang_continuum.core.offload import LearnedReload, ReloadCost
from sglang_continuum.core.pinning import Pinning
from sglang_continuum.core.pins import Pin, PinTable
from sglang_continuum.core.priority import Waiting, context_gone, returning_context
from sglang_continuum.core.programs import ProgramRegistry, ProgramState
from sglang_continuum.core.rules import Rules, resolve_rules
from sglang_continuum.core.scopes import ScopeRanks
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.shedding import Spare
from sglang_continuum.core.silence import Silence
from sglang_continuum.core.stats_exchange import DURATION, OUTCOME, Sample
from sglang_continuum.core.tool_stats import UNKNOWN_TOOL, ToolStats
from sglang_continuum.core.ttl import TTLModel
from sglang_continuum.core.turns import AdmissionRecord, FinishOutcome, StepPlan, TurnTag
from sglang_continuum.core.upload import Uploads

CachedLookup = Optional[Callable[[], Optional[int]]]  # how much of a prompt is cached, looked up on demand
logger = logging.getLogger(__name__)


class ContinuumController:
    def __init__(
        self,
        settings: ContinuumSettings,
        *,
        clock: Clock,
        budget_tokens: int = 0,
        pin_ceiling_tokens: int = 0,
        rules: Optional[Rules] = None,
    ) -> None:
        self.settings = settings
        self.rules = rules or resolve_rules(settings.rules)
        self.clock = clock
        self.timings = self.rules.timings
        self.timings.check(settings.max_ttl_s)
        self.stats = ToolStats()
        self.ttl_model: TTLModel = self.rules.ttl_model(settings, self.stats)
        bounds, rebuild = {"max_ttl_s": settings.max_ttl_s, "max_hold_s": settings.max_hold_s}, self.ttl_model.prefill_s
        self.residency = self.rules.residency(settings.admission_control, self.stats, rebuild, **bounds)
        self.door = self.rules.door(settings.admission_control, self.residency)
        self.ttl_model.read_engine(self.residency.engine)  # without a measured profile: the engine's prefill rate
        self.programs = ProgramRegistry(
            idle_timeout_s=self.timings.program_idle_timeout_s,
            watcher=self.door.working_set,
            # the bound drops no program whose pin (device or host) holds its context for its return
            holds_memory=lambda state: state.program_id in self.pins or state.program_id in self.host.pins,
        )
        self.door.working_set.pinned = lambda pid: pid in self.pins  # its pin keeps its room
        self.silence = Silence(self.stats, self.programs)  # programs whose clients announce no ends
        scoped = settings.program_scope_header is not None  # fair shares between senders (``scopes.py``)
        self.pins = PinTable(budget_tokens, ceiling_tokens=pin_ceiling_tokens, scoped=scoped)  # the ceiling: residents
        self.shedding = self.rules.shedding(self.pins, self.programs, self.silence)
        rooms = {"programs": self.programs, "silence": self.silence, "ttl_model": self.ttl_model, "door": self.door}
        self.pinning = Pinning(self.pins, self.shedding, **rooms, max_ttl_s=settings.max_ttl_s)
        # the pins' counts, owned by their room, read here by the metrics and the snapshot
        self.counters, self.sheds, self.survival = self.pinning.counters, self.pinning.sheds, self.pinning.survival
        self.bounded = self.rules.wait_bound(settings.max_overtakes)
        self.host = HostPins(self.programs, self.timings, clock, offload_to_host=settings.offload_to_host)
        self.uploads = Uploads(self.host, self.pinning, self.programs, self.ttl_model, settings)  # tool gaps
        self.critical = self.rules.critical(self.programs, self.door.working_set)  # multi-agent critical paths
        self.applications = self.rules.applications(idle_s=self.rules.timings.program_idle_timeout_s)
        self.scopes = ScopeRanks(enabled=scoped)
        self.admission = AdmissionCounters()
        self.program_counters = ProgramCounters()
        self.identity = IdentityCounters()
        self._terminal_tools = frozenset(settings.terminal_tools)
        self._rank = itertools.count(1)
        # each tool sample recorded here is also handed to this (a StatsExchange's record)
        self.share_sample: Optional[Callable[[str, str, float], None]] = None
        self.last_admission: Optional[AdmissionRecord] = None  # the latest turn_admitted's record
        self.rekeyed: set[str] = set()  # programs whose waiting turns' queue keys changed (drained by the order)

    def attach_host_tier(
        self, *, reload: ReloadCost, host_budget_tokens: int, hold_cost: float, learn_reload: bool = False
    ) -> None:
        """HiCache is on: misses reload instead of recomputing, and host pins may hold
        ``host_budget_tokens`` of the host pool. ``learn_reload``: no bandwidth was measured, so a
        reload costs what the engine's own steps pay for their loads (``reload`` until they say)."""
        cost = LearnedReload(reload, self.residency.engine.prefill.load_seconds_per_token) if learn_reload else reload
        self.host.attach(cost, host_budget_tokens)
        self.ttl_model.use_host_tier(cost, hold_cost, self.timings.max_host_ttl_s)
        self.door.use_host_tier()

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
        if not meta.has_program:  # a program of its own
            tag = TurnTag(meta, rank, self.scopes.rank(meta.scope, rank), now)
            self._enter(tag, now, waiting_ahead)
            return tag
        program_rank = self.applications.rank(meta.app_id, rank, now)
        if meta.program_id not in self.programs:
            program_rank = self.scopes.rank(meta.scope, program_rank)
            late = self.silence.came_back(meta.program_id, now)
            if late is not None:  # presumed ended, and back after all: the tool took this long
                self.program_counters.presumed_returned += 1
                self._record_tool_sample(DURATION, late[0], late[1])
                self._record_tool_sample(OUTCOME, late[0], 1.0)
        state, ret = self.programs.turn_arrived(meta.program_id, now, program_rank)
        if state is None:  # a new id the full registry turned away: served as a turn without one
            self.program_counters.refused += 1
            tag = TurnTag(replace(meta, program_id=None, source=SOURCE_NONE), rank, program_rank, now)
            self._enter(tag, now, waiting_ahead)
            return tag
        state.announces_end |= meta.announces_end
        self.critical.arrived(state, meta.app_id, meta.critical)
        if state.turns_arrived == 1:
            state.first_step, state.scope = meta.step, meta.scope
            self.program_counters.seen += 1
        if ret is not None:
            self._record_tool_sample(DURATION, ret.tool, ret.seconds)  # TTL models read tool times from self.stats
            self._record_tool_sample(OUTCOME, ret.tool, 1.0)
        self.pinning.returned(state)  # its pin was shed and it came back: a hit the shed cost
        miss = state.turns_arrived > 1 and meta.program_id not in self.pins
        tag = TurnTag(meta, rank, state.arrival_rank, now, miss, turn=state.turns_arrived, program=state)
        tag.new_program = state.turns_admitted == 0 and state.turns_finished == 0
        if miss and not tag.new_program and cached_tokens is not None:
            cached = cached_tokens()
            tag.context_gone = context_gone(state.context_tokens, prompt_tokens, cached)
            previous = returning_context(state.context_tokens, prompt_tokens)
            tag.lost_tokens = max(0, previous - (cached or 0)) if cached is not None else 0
            if cached is not None and state.let_go:  # what a context let go loses prices residency
                self.residency.let_go_returned(previous, cached, now)
        self._enter(tag, now, waiting_ahead)
        return tag

    def turn_requeued(self, tag: TurnTag, *, waiting_ahead: int = 0) -> None:
        """A retracted turn is back in the queue: its wait starts again (running is not waiting)."""
        self._enter(tag, self.clock(), waiting_ahead)

    def _enter(self, tag: TurnTag, now: float, waiting_ahead: int) -> None:
        tag.queued_at = now
        tag.overtake_base, tag.overtake_budget = self.bounded.entry(tag, waiting_ahead)

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
        returning = state is not None and state.turns_admitted > 0
        if cached_tokens is not None and returning:
            self.bounded.observe_return(state.context_tokens, context_tokens, cached_tokens)
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
            self.bounded.return_loss.ratio,
            state.context_tokens if returning else None,
            state.pin_end if returning else None,
        )
        self.admission.admitted += 1
        self.scopes.admitted(tag.program_rank)
        self.residency.holds.left(tag, now, admitted=True)
        if not probe:
            self.bounded.admitted(context_tokens, cached_tokens or 0)
        self.admission.overdue_admitted += overdue
        if pid is None or not self._current(tag.meta, tag):
            return None
        state = self.programs.turn_admitted(pid, now, context_tokens, cached_tokens)
        if state is not None and state.turns_admitted == 1 and state.in_flight > 1:
            self.rekeyed.add(pid)  # its other waiting turns are no new program's any more (``priority.py``)
        lost = state is not None and state.pin_lost_waiting
        if lost:
            state.pin_lost_waiting = False
        if tag.returning_miss or lost:
            self.ttl_model.observe_queue_delay(now - tag.arrival)
        return self.pinning.consume(pid)

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
        state = self.programs.turn_finished(pid, now, tool, context_tokens, meta.tool_time_s)
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
            self.pinning.pin(out, state, tool, context_tokens, handle, now)
        if out.pin is None:
            self.door.kept_nothing(state)
        self.silence.went_out(state)
        return out

    def turn_aborted(self, meta: ProgramMeta, tag: Optional[TurnTag] = None) -> list[Pin]:
        """Abort: forget the pending tool call and drop the program's pins (``tag``: as for
        ``turn_finished``)."""
        self.residency.holds.left(tag, self.clock(), admitted=False)
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

    def turn_retracted(self, tag: TurnTag) -> list[Pin]:
        """Retraction: the turn goes back to the queue; its program's device pin (if any) must
        not hold memory meanwhile. Host copies stay (the turn will want them)."""
        if not tag.meta.has_program or not self._current(tag.meta, tag):
            return []
        pin = self.pinning.release(tag.meta.program_id)
        return [] if pin is None else [pin]

    def step(self, program_waiting: Callable[[str], bool], capacity_tokens: int = 0) -> StepPlan:
        """Once per scheduler step: residency priced at the step's ``capacity_tokens`` (held turns
        whose bound passed are re-keyed), pins past their deadline (held at most
        ``max_wait_hold_s`` longer while their program has a turn waiting), programs forgotten for
        idleness (and what they held), host pins past their host TTL."""
        now = self.clock()
        plan = StepPlan()
        self.rekeyed.update(tag.meta.program_id for tag in self.residency.step(now, capacity_tokens))
        self.critical.step(now, capacity_tokens)
        hold_s = self.timings.max_wait_hold_s  # an expired pin whose program has a turn waiting is held longer

        def hold(pin: Pin) -> Optional[float]:
            return pin.deadline + hold_s if hold_s > 0 and program_waiting(pin.program_id) else None

        plan.expired = self.pinning.expire(now, hold)
        self.programs.forget_idle(now)
        for state in self.programs.drain_forgotten():
            self.program_counters.forgotten += 1
            self._drop_program(state, plan)
        for state in self.silence.presume_ended(now, self.programs, self.pins):
            self.program_counters.presumed_ended += 1
            self._drop_program(state, plan)
        plan.host_expired = self.host.expire(now, hold)
        return plan

    def shed(
        self,
        reason: str,
        *,
        ranked_after: Optional[int] = None,
        keep: Optional[str] = None,
        spares: Sequence[Spare] = (None,),
    ) -> Optional[Pin]:
        """The one shed path: the pin ``shedding.py`` chooses (stale first, then the latest
        program's, optionally only one ranked after ``ranked_after``; never ``keep``'s; ``spares``:
        sparing rules tried in turn), counted under ``reason`` (one of ``SHED_REASONS``; a stale
        pin counts as ``stale``). None when there is none."""
        assert reason in SHED_REASONS, reason
        spares = self.critical.spares(keep, spares, self.pins)  # a non-critical turn spares critical pins first
        pin = self.pinning.shed(reason, self.clock(), ranked_after=ranked_after, keep=keep, spares=spares)
        if pin is not None:
            self.admission.admission_sheds += reason != "alloc"  # for a blocked turn
            if reason == "hold_bound":  # released for a turn whose hold is up: it takes its own turn later
                self.door.kept_nothing(self.programs.get(pin.program_id))
        return pin

    def reset(self) -> None:
        """``/flush_cache``: pins dropped unlocked, as flushed; the losses it causes are no signal."""
        self.pinning.flushed()
        self.host.clear()
        self.bounded.return_loss.reset()
        self.residency.let_go_loss.reset()

    # -- queue order and admission -------------------------------------------------------
    def priority_key(self, tag: TurnTag, retracted: bool) -> tuple:
        """The waiting request's key in the rules' order (by default program-level FCFS with
        bounded waiting, ``priority.py``)."""
        pid = tag.meta.program_id
        pinned = pid is not None and pid in self.pins
        return self.rules.order(Waiting(tag, retracted, self.is_overdue(tag), pinned))

    def is_overdue(self, tag: TurnTag) -> bool:
        return self.bounded.is_overdue(tag)  # overtaken by its budget of later arrivals

    def holds_back(self, tag: TurnTag, request_tokens: int, capacity_tokens: int, **room) -> bool:
        """The door (``core/door.py``, ``Door.holds_back``, whose keywords ``room`` passes on) for a
        waiting turn; a turn held records it (once per turn)."""
        state = self.programs.get(tag.meta.program_id) if tag.meta.has_program else None
        capacity_tokens -= self.critical.withheld(state)  # a critical path's unused reserve is not the rest's
        held = self.door.holds_back(tag, state, request_tokens, capacity_tokens, now=self.clock(), **room)
        if held:
            self.residency.held(tag, state, self.clock())  # a first turn binds; a new hold is bounded
            if not tag.held_back:
                tag.held_back = True
                self.admission.held_back += 1
                self.admission.paused += not tag.new_program
        return held

    def admission_reservation(self, tag: TurnTag, request_tokens: int) -> int:
        """What a turn added to a prefill selection reserves in the working set once admitted."""
        return self.door.reservation(tag, request_tokens)

    # -- host tier (core/host_pins.py) ---------------------------------------------------------
    def offload(self, pin: Pin) -> FinishOutcome:
        return self.host.offload(pin, self.ttl_model)  # a device pin ended first: keep a host copy?

    def host_returned(self, tag: TurnTag, loaded_tokens: int) -> list[Pin]:
        """A later turn was admitted: count what came back from host and release the host pin."""
        if not tag.meta.has_program or not self._current(tag.meta, tag):
            return []
        return self.host.returned(tag.meta.program_id, loaded_tokens)

    # -- warm start ----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Tool statistics plus the model's current signals: what warm start saves and loads,
        and what an operator reads to see why TTLs are what they are."""
        pins = {"live": len(self.pins), "tokens": self.pins.pinned_tokens, "budget": self.pins.budget_tokens}
        counts = {"counters": self.counters, "host_counters": self.host.counters, "admission": self.admission}
        counts.update(sheds=self.sheds, programs=self.program_counters, identity=self.identity)
        out = {"rules": self.rules.name, "ttl_model": self.ttl_model.name, "tool_stats": self.stats.to_dict()}
        out.update(signals=self.ttl_model.signals(), pins=pins, host_pins=self.host.snapshot())
        out.update({name: counter_values(group) for name, group in counts.items()})
        return {**out, "uploads": self.uploads.snapshot(), "critical": self.critical.snapshot()}

    def merge_peer_samples(self, samples: list[Sample]) -> None:
        """Peers' tool samples (``StatsExchange.poll``) into this worker's windows; not shared again."""
        self.stats.merge(samples)

    def load_snapshot(self, tool_stats: dict, signals: dict) -> None:
        self.stats.load_dict(tool_stats)
        self.ttl_model.load_signals(signals)

    # -- integrity -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Cross-structure invariants; raises AssertionError. Run after every operation in the
        property tests, and at idle while serving with ``SGLANG_CONTINUUM_CHECK_INTEGRITY=1``."""
        self.pinning.check_integrity()
        self.host.check_integrity(self.pins)
        self.programs.check_integrity()
        self.stats.check_integrity()
        self.door.check_integrity()
        assert all(self.programs.get(pid) is s for pid, s in self.door.working_set.items()), "working set"
        for room in (self.bounded, self.silence, self.uploads, self.critical, self.applications, self.scopes):
            room.check_integrity()

    # -- internals -----------------------------------------------------------------------
    def _current(self, meta: ProgramMeta, tag: Optional[TurnTag]) -> bool:
        """Whether ``tag``'s turn belongs to the program registered under its id now."""
        return tag is None or tag.program is None or self.programs.get(meta.program_id) is tag.program

    def _drop_pins(self, program_id: str) -> list[Pin]:
        released = self.host.drop(program_id)
        pin = self.pinning.release(program_id)
        return released if pin is None else [*released, pin]

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
        self.stats.record_sample(kind, tool, value)
        if self.share_sample is not None:
            self.share_sample(kind, tool, value)
