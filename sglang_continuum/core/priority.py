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
program ids at all keeps pure FCFS order.
"""

from __future__ import annotations

from typing import Protocol

RETRACTED, PINNED, OVERDUE, WAITING = 0, 1, 2, 3

QueueKey = tuple[int, int, int]


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
