"""Program-level FCFS with bounded waiting: the order in which waiting requests are admitted.

Keys, in order (smaller first):
1. retracted/preempted requests first (they already paid for admission once);
2. requests whose program holds a live pin (their prefix is resident: admitting them is cheap
   and frees the pin's memory);
3. overdue requests, oldest first: no request waits unboundedly behind programs that keep
   coming back (what makes a request overdue is the controller's business: being overtaken by
   its budget of later arrivals, ``core/bounded_waiting.py``);
4. program arrival (the program's first turn), then request arrival.
A request with no program id is a program of its own that arrived with it, so a queue with no
program ids at all keeps pure FCFS order. So is a returning turn that finds less than
``KEEPS_PLACE`` of its context cached when it arrives (``place_rank``): program order pays by
serving a program while its context is still there; a turn whose context is gone re-prefills it
wherever it is placed, and placed by its program's age it puts the longest contexts at the head
of the queue, where SGLang's prefill admission stops at the first request that does not fit.
"""

from __future__ import annotations

from typing import Optional, Protocol

RETRACTED, PINNED, OVERDUE, WAITING = 0, 1, 2, 3

QueueKey = tuple[int, int, int]
# the share of its context a returning turn must find cached when it arrives to keep its program's
# place in the queue
KEEPS_PLACE = 0.5


def place_rank(
    program_rank: int, request_rank: int, context_tokens: int, prompt_tokens: int, cached_tokens: Optional[int]
) -> int:
    """The rank program order places a returning turn without a pin by: its program's, or its own
    arrival's when it found less than ``KEEPS_PLACE`` of its context cached on arrival
    (``cached_tokens`` of ``prompt_tokens``; None: not known, it keeps its program's place).
    ``context_tokens``: what its program had when its last turn ended; only what the prompt still
    extends counts (a client that cut its history lost nothing to the pool)."""
    context = min(context_tokens, prompt_tokens) if prompt_tokens > 0 else context_tokens
    if cached_tokens is None or context <= 0 or cached_tokens >= KEEPS_PLACE * context:
        return program_rank
    return request_rank


class OrderKey(Protocol):
    """A queue order (``core.rules.Rules.order``): the key of one waiting request."""

    def __call__(
        self, *, retracted: bool, overdue: bool, pinned: bool, program_rank: int, request_rank: int
    ) -> QueueKey: ...


def program_fcfs(*, retracted: bool, overdue: bool, pinned: bool, program_rank: int, request_rank: int) -> QueueKey:
    if retracted:
        return (RETRACTED, program_rank, request_rank)
    if pinned:
        return (PINNED, program_rank, request_rank)
    if overdue:
        return (OVERDUE, request_rank, 0)
    return (WAITING, program_rank, request_rank)
