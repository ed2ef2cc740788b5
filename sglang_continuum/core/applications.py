"""Application-level FCFS: the agents of one multi-agent application share its place in the queue.

Program-level FCFS ranks a program by its first turn's arrival. In a multi-agent application an
agent starts when the agents it depends on end, so an early application's later agents arrive
after the first agents of applications that came after it, rank behind them, and the early
application finishes last: under load every application's latency grows towards the makespan.
A program whose client names its application (``metadata.APP_ID_KEY``) takes instead the rank of
that application's first program (the arrival order of applications), so the application that
came first is served first, as a program is. Within one rank the queue keeps request arrival.

The rank is a client hint, no more trusted than a program id: a client that names another
application's id takes that application's place, as a client that sends another program's id
does, and bounded waiting (``bounded_waiting.py``) bounds what either costs the others. An
application unseen for ``idle_s`` (no turn of any of its programs; the rules' program idle timeout)
is forgotten; its next program starts it again at its own arrival. The table is bounded (least
recently seen dropped first). A ``Rules.applications`` slot: the lab's ablation ranks programs alone.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from sglang_continuum.core.programs import PROGRAM_IDLE_TIMEOUT_S

MAX_APPLICATIONS = 10_000


class ApplicationRanks:
    def __init__(self, *, max_applications: int = MAX_APPLICATIONS, idle_s: float = PROGRAM_IDLE_TIMEOUT_S) -> None:
        if max_applications < 1 or idle_s <= 0:
            raise ValueError("applications: need max_applications >= 1 and idle_s > 0")
        self.max_applications, self.idle_s = max_applications, idle_s
        self._apps: OrderedDict[str, list] = OrderedDict()  # app id -> [rank, last seen], least recent first

    def __len__(self) -> int:
        return len(self._apps)

    def rank(self, app_id: Optional[str], rank: int, now: float) -> int:
        """The queue rank for a turn that arrived ``rank``-th of a program of ``app_id``: its
        application's (the rank of the first program of it seen), or ``rank`` itself without an
        application or for the first program of one. Every call marks the application seen."""
        if app_id is None:
            return rank
        entry = self._apps.get(app_id)
        if entry is None or now - entry[1] > self.idle_s:
            entry = [rank, now]
            self._apps[app_id] = entry
            while len(self._apps) > self.max_applications:
                self._apps.popitem(last=False)
        entry[1] = now
        self._apps.move_to_end(app_id)
        return entry[0]

    def check_integrity(self) -> None:
        assert len(self._apps) <= self.max_applications, "applications past their bound"
        seen = [entry[1] for entry in self._apps.values()]
        assert seen == sorted(seen), "applications out of recency order"
