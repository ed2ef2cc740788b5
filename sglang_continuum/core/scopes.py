"""Fair shares between scopes: the rank a program takes when program ids are scoped to the client
that sent them (``program_scope_header``).

Program-level FCFS ranks a program by its first turn's arrival, and that rank orders everything:
the queue, the door's first turns, which pin is shed first. So one client that starts a thousand
programs at once puts every program another client starts after them behind all thousand, at the
door and in the queue, and its pins ahead of theirs when the budget is full.

With scopes, a program's rank is its start tag under start-time fair queuing (SFQ: Goyal, Vin and
Cheng, SIGCOMM 1996) over the scopes, a program (or a request without one: a program of its own)
being one unit of work: its start is the later of the virtual clock (the latest start admitted)
and its scope's previous start plus one. A scope that starts one program at a time is never behind
another that starts many: each is served in turn, one program of each per round, whatever either
has queued. The rank is ``(start << ARRIVAL_BITS) + arrival``, so a start is shared in arrival
order, and within a scope starts only grow: with one scope the order is program arrival exactly.
Without ``program_scope_header`` every request is unscoped and the rank is the arrival itself.

A scope is a credential's or a tenant header's hash, so fairness is between what the operator's
header tells apart: a client that can send any tenant value can take as many shares as values.
The table is bounded (least recently seen dropped first); a scope dropped and seen again starts at
the clock, which is where an idle scope starts anyway. Pure: no SGLang.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

ARRIVAL_BITS = 40  # arrivals a rank tells apart: 10^12 requests
MAX_SCOPES = 10_000


class ScopeRanks:
    def __init__(self, *, enabled: bool, max_scopes: int = MAX_SCOPES) -> None:
        if max_scopes < 1:
            raise ValueError("scopes: need max_scopes >= 1")
        self.enabled, self.max_scopes = enabled, max_scopes
        self.clock = 0  # the virtual clock: the latest start admitted
        self._next: OrderedDict[Optional[str], int] = OrderedDict()  # scope -> its next start, least recent first

    def __len__(self) -> int:
        return len(self._next)

    def rank(self, scope: Optional[str], arrival: int) -> int:
        """The rank of a program of ``scope`` whose first turn is the ``arrival``-th request."""
        if not self.enabled:
            return arrival
        start = max(self.clock, self._next.pop(scope, 0))
        self._next[scope] = start + 1
        while len(self._next) > self.max_scopes:
            self._next.popitem(last=False)
        return (start << ARRIVAL_BITS) + arrival  # past 2^40 arrivals the order blurs, nothing breaks

    def admitted(self, rank: int) -> None:
        """A turn of the program ranked ``rank`` was admitted: the clock reaches its start."""
        if self.enabled:
            self.clock = max(self.clock, self.start(rank))

    @staticmethod
    def start(rank: int) -> int:
        return rank >> ARRIVAL_BITS

    def check_integrity(self) -> None:
        assert len(self._next) <= self.max_scopes, "scopes past their bound"
        assert self.enabled or not self._next, "scopes ranked while off"
        assert all(start >= 0 for start in self._next.values()), "negative start"
