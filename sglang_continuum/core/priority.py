"""Program-level FCFS: the order in which waiting requests are admitted.

Keys, in order (smaller first):
1. retracted/preempted requests first (they already paid for admission once);
2. requests whose program holds a live pin (their prefix is resident: admitting them frees it);
3. program arrival (the program's first turn);
4. request arrival.
A request with no program id is a program of its own that arrived with it, so a queue with no
program ids at all keeps pure FCFS order.
"""

from __future__ import annotations


def program_fcfs_key(retracted: bool, pinned: bool, program_seq: int, request_seq: int) -> tuple:
    return (not retracted, not pinned, program_seq, request_seq)
