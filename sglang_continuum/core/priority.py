"""Program-level FCFS with bounded waiting: the order in which waiting requests are admitted.

Keys, in order (smaller first):
1. retracted/preempted requests first (they already paid for admission once);
2. requests that waited ``max_queue_wait_s`` or longer, oldest first -- no request waits
   unboundedly behind programs that keep coming back;
3. requests whose program holds a live pin (their prefix is resident: admitting them frees it);
4. program arrival (the program's first turn), then request arrival.
A request with no program id is a program of its own that arrived with it, so a queue with no
program ids at all keeps pure FCFS order. With ``program_order`` off (the pins-only ablation)
only 1 and request arrival remain: SGLang's fcfs.
"""

from __future__ import annotations

RETRACTED, OVERDUE, PINNED, WAITING = 0, 1, 2, 3


def priority_key(
    *, retracted: bool, overdue: bool, pinned: bool, program_rank: int, request_rank: int, program_order: bool = True
) -> tuple[int, int, int]:
    if not program_order:
        return (RETRACTED if retracted else WAITING, request_rank, 0)
    if retracted:
        return (RETRACTED, program_rank, request_rank)
    if overdue:
        return (OVERDUE, request_rank, 0)
    return (PINNED if pinned else WAITING, program_rank, request_rank)
