"""Program-level FCFS with bounded waiting: the order in which waiting requests are admitted.

Keys, in order (smaller first):
1. retracted/preempted requests first (they already paid for admission once);
2. turns the door held until their hold bound passed (``residency.py``), oldest first: the next
   room is theirs, before any other turn's;
3. requests whose program holds a live pin (their prefix is resident: admitting them is cheap
   and frees the pin's memory);
4. overdue requests, oldest first: no request waits unboundedly behind programs that keep
   coming back (what makes a request overdue is the controller's business: being overtaken by
   its budget of later arrivals, ``core/bounded_waiting.py``);
5. returning turns that found their context cached when they arrived: program arrival (the
   program's first turn), then request arrival;
6. returning turns that found their context gone (``context_gone``), in request arrival;
7. turns of new programs (none of their turns admitted yet: first turns), then requests without a
   program id: program arrival, then request arrival.
Program order pays by serving a program while its context is still there. A return whose context
is gone re-prefills it wherever it is placed; placed by its program's age it would put the longest
contexts at the head of the queue, where SGLang's prefill admission stops at the first request
that does not fit. It still goes before new programs: it is a program already in flight, and its
context is what the pool was sized to hold. A request with no program id is a program of its own
that arrived with it, so a queue with no program ids at all keeps pure FCFS order. A turn of a new
program whose first turn is admitted ahead of it is a turn of a program in flight from then on
(its key moves). So the last class holds only first turns and the requests the door never holds
(``door_exempt``): the adapter ends its walk at a held first turn once no first turn waiting would
fit and none of those waits behind it (``door.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from sglang_continuum.core.metadata import SOURCE_INFERRED
from sglang_continuum.core.turns import TurnTag

RETRACTED, DUE, PINNED, OVERDUE, WAITING, CONTEXT_GONE, NEW = 0, 1, 2, 3, 4, 5, 6

QueueKey = tuple[int, int, int]
# the share of its context a returning turn must find cached when it arrives to keep its
# program's place
KEEPS_PLACE = 0.5


def door_exempt(tag: TurnTag) -> bool:
    """A turn the door never holds, whatever the room: a request without a program id (a unit of
    work, not a program's commitment), or a continuation found by prefix (its context is the
    pool's already)."""
    return not tag.meta.has_program or tag.meta.source == SOURCE_INFERRED


def context_gone(context_tokens: int, prompt_tokens: int, cached_tokens: Optional[int]) -> bool:
    """Whether a returning turn found less than ``KEEPS_PLACE`` of its context cached as it arrived
    (``cached_tokens`` of ``prompt_tokens``; None: not known, it keeps its place).
    ``context_tokens``: what its program had when its last turn ended; only what the prompt still
    extends counts (a client that cut its history lost nothing to the pool)."""
    context = returning_context(context_tokens, prompt_tokens)
    return cached_tokens is not None and context > 0 and cached_tokens < KEEPS_PLACE * context


def returning_context(context_tokens: int, prompt_tokens: int) -> int:
    """What of its program's last context a returning turn's prompt still extends."""
    return min(context_tokens, prompt_tokens) if prompt_tokens > 0 else context_tokens


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a queue order knows of one waiting request: its own record (``TurnTag``, read as it is)
    and three facts of the moment."""

    tag: TurnTag
    retracted: bool  # SGLang re-queued it after a retraction
    overdue: bool  # overtaken by its budget of later arrivals (``core/bounded_waiting.py``)
    pinned: bool  # its program holds a live pin

    @property
    def program_rank(self) -> int:
        """Arrival order of its program's first turn (its own without a program)."""
        return self.tag.program_rank

    @property
    def request_rank(self) -> int:
        return self.tag.request_rank

    @property
    def context_gone(self) -> bool:
        """A return that found most of its context gone as it arrived."""
        return self.tag.context_gone

    @property
    def due(self) -> bool:
        """The door held it until its hold bound passed."""
        return self.tag.due

    @property
    def new_program(self) -> bool:
        """No turn of its program has been admitted, when it arrived or since (or no program): its
        key changes when another turn of its program is admitted first (the controller's
        ``rekeyed``)."""
        program = self.tag.program
        return self.tag.new_program and (program is None or program.turns_admitted == 0)


OrderKey = Callable[[Waiting], QueueKey]  # a queue order (``core.rules.Rules.order``)


def program_fcfs(w: Waiting) -> QueueKey:
    if w.retracted:
        return (RETRACTED, w.program_rank, w.request_rank)
    if w.due:
        return (DUE, w.request_rank, 0)
    if w.pinned:
        return (PINNED, w.program_rank, w.request_rank)
    if w.overdue:
        return (OVERDUE, w.request_rank, 0)
    if w.new_program:
        return (NEW, w.program_rank, w.request_rank)
    if w.context_gone:
        return (CONTEXT_GONE, w.request_rank, 0)
    return (WAITING, w.program_rank, w.request_rank)
