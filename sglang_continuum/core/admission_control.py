"""Program-level admission control: when a new program's first turn may start.

A first turn waits while the pool cannot hold the working sets of the programs already in flight
(``ProgramRegistry``: programs with a turn waiting or running, and, by default, those out on a tool
that hold a pin, ``working_set_follows_pins``; each counted, by default, at least at the mean final
context of programs that ended, since agent contexts grow, ``admission_expects_growth``) plus its own, or, with
``return_loss_threshold`` set (off by default), while returning programs are losing their contexts
(``ReturnLossMeter``: the pool thrashes although today's contexts fit, because they grow). An
overdue first turn passes while the working sets fit ``overdue_admission_overcommit`` pools; the
default, 1, never lets it past the pool (which is already sized for growth): at the door it waits
for room like any other, and bounded waiting orders the queue, it does not open the door (an open
door is how the wave that thrashes the pool gets in). Later turns, continuations found by
prefix and requests without a program id are never held (except by load control, an experimental
setting off by default: while the pool thrashes, returning turns of the latest programs wait too);
the adapter never asks when holding back would idle the engine.
"""

from __future__ import annotations

from typing import Callable

from sglang_continuum.core.counters import AdmissionCounters
from sglang_continuum.core.metadata import SOURCE_INFERRED
from sglang_continuum.core.programs import ProgramRegistry
from sglang_continuum.core.return_loss import ReturnLossMeter
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.turns import TurnTag


class AdmissionControl:
    def __init__(self, settings: ContinuumSettings, programs: ProgramRegistry, counters: AdmissionCounters) -> None:
        self.settings = settings
        self.programs = programs
        self.counters = counters
        # measured even when the threshold is 0 (off): the ratio is exported either way
        self.return_loss = ReturnLossMeter(window=settings.return_loss_window, threshold=settings.return_loss_threshold)

    @property
    def thrashing(self) -> bool:
        """Returning programs lose more than ``return_loss_threshold`` of their contexts: the
        working sets in flight do not fit the pool, whatever their current sizes add up to."""
        return self.return_loss.thrashing

    def observe_return(self, previous_tokens: int, context_tokens: int, cached_tokens: int) -> None:
        """A returning turn was admitted with ``cached_tokens`` of its ``context_tokens`` prompt
        cached; its program had ``previous_tokens`` when its last turn finished (only what this
        prompt still extends counts: a client that cut its history lost nothing to the pool)."""
        self.return_loss.observe(min(previous_tokens, context_tokens), cached_tokens)

    def holds_back(
        self,
        tag: TurnTag,
        request_tokens: int,
        capacity_tokens: int,
        overdue: Callable[[], bool],
        *,
        idle: bool = False,
        pending_tokens: int = 0,
    ) -> bool:
        """Whether ``tag``'s turn waits; ``pending_tokens``: what turns admitted earlier in the same
        prefill selection reserve (the working set learns of them only once the batch is formed;
        without them every first turn of a selection would see the same room, and a wave of new
        programs would pass together)."""
        if not self.settings.admission_control or not tag.meta.has_program:
            return False
        idle_limit = self.settings.idle_admission_overcommit
        if idle and idle_limit <= 0:
            return False  # work-conserving: a waiting engine is never kept waiting
        if tag.meta.source == SOURCE_INFERRED:
            return False  # a continuation found by prefix: its context is already the pool's business
        state = self.programs.get(tag.meta.program_id)
        if state is None or (self.programs.working_programs == 0 and pending_tokens == 0):
            return False
        room = capacity_tokens * self.settings.admission_working_set_fraction
        if state.turns_admitted > 0:
            return not idle and self._suspends(tag, state.arrival_rank, request_tokens, room, overdue)
        demand = self._demand(request_tokens) + pending_tokens
        if demand <= room and not self.thrashing:
            return False
        if idle:
            return demand > room * idle_limit and self._hold(tag, thrashing=False)
        if overdue():  # bounded waiting, within the overcommit limit
            limit = self.settings.overdue_admission_overcommit
            if limit <= 0 or demand <= room * limit:
                if not tag.bypassed:
                    tag.bypassed = True
                    self.counters.bypassed += 1
                return False
            self.counters.bypass_refused += 1
        return self._hold(tag, thrashing=demand <= room)

    def _hold(self, tag: TurnTag, *, thrashing: bool) -> bool:
        """Hold a first turn back, counted once per request (``thrashing``: its working sets fit,
        the thrash signal holds it)."""
        if not tag.held_back:
            tag.held_back = True
            self.counters.held_back += 1
            self.counters.held_back_thrashing += thrashing
        return True

    def reserved_tokens(self) -> int:
        """The pool admission control keeps for the programs in flight."""
        if not self.settings.admission_expects_growth:
            return self.programs.working_set_tokens
        return self.programs.reserved_tokens()

    def reservation(self, tag: TurnTag, request_tokens: int) -> int:
        """What admitting ``tag``'s turn adds to ``reserved_tokens`` (0 for a request without a
        program, or with admission control off; with ``admission_counts_selection`` off, the
        ablation of the behaviour before 2026-11-25, a selection's turns reserve nothing)."""
        s = self.settings
        if not s.admission_control or not s.admission_counts_selection or not tag.meta.has_program:
            return 0
        floor = self.programs.expected_final_context if s.admission_expects_growth else 0
        return self.programs.reservation_added(tag.meta.program_id, request_tokens, floor)

    def _demand(self, request_tokens: int) -> int:
        """The pool the working set needs with one more program: today's contexts, or, with
        ``admission_expects_growth``, each (the new one included) at least as large as programs
        end up (an agent's first turn is a fraction of its last)."""
        newcomer = request_tokens
        if self.settings.admission_expects_growth:
            newcomer = max(newcomer, self.programs.expected_final_context)
        return self.reserved_tokens() + newcomer

    def _suspends(self, tag: TurnTag, rank: int, request_tokens: int, room: float, overdue: Callable[[], bool]) -> bool:
        """Load control (``load_control``, experimental, off by default): while the pool thrashes, a
        returning turn waits if the programs ranked before it already fill the pool with their
        working sets, so that they keep their contexts instead of every program re-prefilling
        (Denning's load control: suspend the latest processes while the fault rate says the
        working sets do not fit). Bounded waiting still applies: an overdue turn passes."""
        if not self.settings.load_control or not self.thrashing:
            return False
        if self.programs.working_set_tokens_ranked_before(rank) + request_tokens <= room or overdue():
            return False
        if not tag.held_back:
            tag.held_back = True
            self.counters.suspended += 1
        return True

    def check_integrity(self) -> None:
        self.return_loss.check_integrity()
