"""Program-level admission control: when a new program's first turn may start.

A first turn waits while the capacity cannot hold the working sets of the programs already in
flight (``ProgramRegistry``: programs with a turn waiting or running, and those out on a tool that
hold a pin, or with a host tier those seen within ``HOST_TIER_WORKING_SET_WINDOW_S``) plus its
own, each counted at least at the mean final context of the programs that ended: agent contexts
grow, so a first turn is a fraction of what its program will need. An overdue first turn waits
for room like any other (bounded waiting orders the queue; it does not open the door, and an open
door is how the wave that thrashes the pool gets in), but it waits first: while an overdue first
turn is held, the first turns behind it in the queue wait too, so that smaller new programs cannot
take, one after another, the room it waits for. Later turns, continuations found by prefix and
requests without a program id are never held, and the adapter never holds a turn when holding it
would idle the engine.

The capacity is the adapter's: the device pool, or with HiCache what the two tiers hold together
under the write policy in force. Past that, letting more programs in only makes the host tier cycle
(every return a re-prefill); holding whole programs at the door keeps the ones admitted served.
"""

from __future__ import annotations

from sglang_continuum.core.counters import AdmissionCounters
from sglang_continuum.core.metadata import SOURCE_INFERRED
from sglang_continuum.core.programs import ProgramRegistry
from sglang_continuum.core.return_loss import ReturnLossMeter
from sglang_continuum.core.turns import TurnTag


class AdmissionControl:
    def __init__(self, enabled: bool, programs: ProgramRegistry, counters: AdmissionCounters) -> None:
        self.enabled = enabled
        self.programs = programs
        self.counters = counters
        # how much of their contexts returning programs find gone: bounded waiting reads it
        self.return_loss = ReturnLossMeter()

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
        *,
        idle: bool = False,
        pending_tokens: int = 0,
        behind_overdue: bool = False,
    ) -> bool:
        """Whether ``tag``'s turn waits; ``idle``: nothing else would run if it did;
        ``pending_tokens``: what turns admitted earlier in the same prefill selection reserve (the
        working set learns of them only once the batch is formed; without them every first turn of
        a selection would see the same room, and a wave of new programs would pass together);
        ``behind_overdue``: an overdue first turn ahead of it in the queue is held."""
        if not self.enabled or idle or not tag.meta.has_program or tag.meta.source == SOURCE_INFERRED:
            return False
        state = self.programs.get(tag.meta.program_id)
        if state is None or state.turns_admitted > 0:
            return False
        if not behind_overdue:
            if self.programs.working_programs == 0 and pending_tokens == 0:
                return False
            demand = self.programs.reserved_tokens() + max(request_tokens, self.programs.expected_final_context)
            if demand + pending_tokens <= capacity_tokens:
                return False
        if not tag.held_back:
            tag.held_back = True
            self.counters.held_back += 1
        return True

    def reservation(self, tag: TurnTag, request_tokens: int) -> int:
        """What admitting ``tag``'s turn adds to the working set's reservation (0 for a request
        without a program, or with admission control off)."""
        if not self.enabled or not tag.meta.has_program:
            return 0
        floor = self.programs.expected_final_context
        return self.programs.reservation_added(tag.meta.program_id, request_tokens, floor)

    def check_integrity(self) -> None:
        self.return_loss.check_integrity()
