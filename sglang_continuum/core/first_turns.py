"""Whether requests with no id that continued nothing are, lately, agents' first turns.

A request that carries no id and extends no recorded context is either single-shot traffic or the
first turn of an agent whose next turn will continue it. Which one is not known for that request,
but it is for the traffic: of the latest such requests that finished, how many were continued
within ``return_s``. When most were, the next one is taken as a new program's first turn at once,
so its first tool gap is pinned like any later one (what an agent that sends ids gets); when most
were not, it is served as under FCFS and nothing is pinned for it. No evidence: not a program.

Pure: no SGLang, no clock of its own.
"""

from __future__ import annotations

from collections import OrderedDict, deque

RETURN_S = 60.0  # a first turn not continued within this long counts as single-shot (> max_ttl_s's default)
WINDOW = 64  # the latest resolved first turns the decision reads
MAX_AWAITING = 100_000  # first turns waiting to be continued; past it the oldest count as not continued


class FirstTurns:
    def __init__(self, *, return_s: float = RETURN_S, window: int = WINDOW, max_awaiting: int = MAX_AWAITING):
        if return_s <= 0 or window < 1 or max_awaiting < 1:
            raise ValueError("need return_s > 0, window >= 1, max_awaiting >= 1")
        self.return_s = return_s
        self.max_awaiting = max_awaiting
        self._awaiting: OrderedDict[str, float] = OrderedDict()  # id -> when it finished, oldest first
        self._outcomes: deque[bool] = deque(maxlen=window)  # True: continued
        self._continued = 0  # of the outcomes

    def are_programs(self) -> bool:
        """Whether the next request that continues nothing should be a new program: more of the
        latest resolved first turns were continued than were not."""
        return 2 * self._continued > len(self._outcomes)

    def finished(self, first_id: str, now: float) -> None:
        """A first turn (no id, continued nothing) finished under ``first_id``."""
        latest = next(reversed(self._awaiting.values()), now)
        self._awaiting[first_id] = max(now, latest)  # kept in time order
        while len(self._awaiting) > self.max_awaiting:
            self._awaiting.popitem(last=False)
            self._outcome(False)

    def continued(self, first_id: str) -> None:
        """A request continued ``first_id``'s context (no-op unless it is a first turn awaiting)."""
        if self._awaiting.pop(first_id, None) is not None:
            self._outcome(True)

    def expire(self, now: float) -> None:
        """First turns not continued within ``return_s`` are single-shot."""
        cutoff = now - self.return_s
        awaiting = self._awaiting
        while awaiting and next(iter(awaiting.values())) < cutoff:
            awaiting.popitem(last=False)
            self._outcome(False)

    def _outcome(self, continued: bool) -> None:
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen:
            self._continued -= outcomes[0]
        outcomes.append(continued)
        self._continued += continued

    def check_integrity(self) -> None:
        assert len(self._awaiting) <= self.max_awaiting, "first turns awaiting over the bound"
        times = list(self._awaiting.values())
        assert all(a <= b for a, b in zip(times, times[1:])), "first turns out of time order"
        assert self._continued == sum(self._outcomes), "first-turn outcome count"
