"""Program-level FCFS with bounded waiting: the order in which waiting requests are admitted.

Keys, in order (smaller first):
1. retracted/preempted requests first (they already paid for admission once);
2. requests whose program holds a live pin (their prefix is resident: admitting them is cheap
   and frees the pin's memory);
3. overdue requests, oldest first: no request waits unboundedly behind programs that keep
   coming back (what makes a request overdue is the controller's business: by default being
   overtaken by its budget of later arrivals, ``core/bounded_waiting.py``);
4. program arrival (the program's first turn), then request arrival.
A request with no program id is a program of its own that arrived with it, so a queue with no
program ids at all keeps pure FCFS order. With ``program_order`` off (the pins-only ablation)
only 1 and request arrival remain: SGLang's fcfs. ``overdue_first`` is the ablation that puts
overdue requests before pinned ones (the order of the old 3 s bound).
"""

from __future__ import annotations

RETRACTED, PINNED, OVERDUE, WAITING = 0, 1, 2, 3
_OVERDUE_FIRST = 0.5  # between RETRACTED and PINNED


def priority_key(
    *,
    retracted: bool,
    overdue: bool,
    pinned: bool,
    program_rank: int,
    request_rank: int,
    program_order: bool = True,
    overdue_first: bool = False,
) -> tuple[float, int, int]:
    if not program_order:
        return (RETRACTED if retracted else WAITING, request_rank, 0)
    if retracted:
        return (RETRACTED, program_rank, request_rank)
    if pinned and not (overdue and overdue_first):
        return (PINNED, program_rank, request_rank)
    if overdue:
        return (_OVERDUE_FIRST if overdue_first else OVERDUE, request_rank, 0)
    return (WAITING, program_rank, request_rank)
