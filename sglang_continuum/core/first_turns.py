"""Whether requests with no id that continued nothing are, lately, agents' first turns.

A request that carries no id and extends no recorded context is either single-shot traffic or the
first turn of an agent whose next turn will continue it. Which one is not known for that request,
but it is for the traffic: of the latest such requests, how many were continued. When most were,
the next one is taken as a new program's first turn at once, so its first tool gap is pinned like
any later one (what an agent that sends ids gets); when most were not, it is served as under FCFS
and nothing is pinned for it. No evidence: not a program.

The estimate must not be biased by censoring. A continued first turn is known within seconds, an
uncontinued one only once nobody can still continue it: counting each outcome as soon as it is
known lets a few fast agents outvote the many single-shot requests still awaiting theirs, and
every single-shot request in between is pinned. So every first turn is watched for the same
*horizon* after it finished and its outcome (continued within the horizon, or not) counts only
then, in the order they finished: a fixed-horizon cohort, which every first turn reaches whatever
its fate. The horizon is ``HORIZON_FACTOR`` times the 90th percentile of the latest continuation
delays (at least ``min_horizon_s``; ``return_s`` before any is known, and at most that): as long
as continued ones typically take, with a margin. An agent continued later than that counts as not
continued, which errs towards FCFS; its delay is still learned (first turns are watched for a late
continuation up to ``return_s``), so a slower agent population lengthens the horizon.

A first turn that was taken as a program and resolves as not continued is single-shot after all:
``expire`` names it, so its pin can go at once instead of at its TTL.

Pure: no SGLang, no clock of its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

RETURN_S = 60.0  # the longest a first turn is waited for (> max_ttl_s's default)
MIN_HORIZON_S = 1.0  # shorter than this, scheduling jitter alone would decide outcomes
HORIZON_FACTOR = 2.0
DELAYS = 32  # the latest continuation delays the horizon reads
WINDOW = 64  # the latest resolved first turns the decision reads
MAX_AWAITING = 100_000  # first turns waiting to be resolved; past it the oldest resolve at once


class FirstTurns:
    def __init__(
        self,
        *,
        return_s: float = RETURN_S,
        window: int = WINDOW,
        max_awaiting: int = MAX_AWAITING,
        min_horizon_s: float = MIN_HORIZON_S,
    ):
        if return_s <= 0 or window < 1 or max_awaiting < 1 or min_horizon_s < 0:
            raise ValueError("need return_s > 0, window >= 1, max_awaiting >= 1, min_horizon_s >= 0")
        self.return_s = return_s
        self.min_horizon_s = min(min_horizon_s, return_s)
        self.max_awaiting = max_awaiting
        # id -> [when it finished, continued since]; oldest first (the cohort order)
        self._awaiting: OrderedDict[str, list] = OrderedDict()
        # resolved as not continued, watched up to return_s for a late continuation's delay
        self._late: OrderedDict[str, float] = OrderedDict()
        self._delays: deque[float] = deque(maxlen=DELAYS)
        self._horizon = return_s
        self._outcomes: deque[bool] = deque(maxlen=window)  # True: continued
        self._continued = 0  # of the outcomes

    def are_programs(self) -> bool:
        """Whether the next request that continues nothing should be a new program: more of the
        latest resolved first turns were continued than were not."""
        return 2 * self._continued > len(self._outcomes)

    @property
    def horizon(self) -> float:
        """How long after finishing a first turn's outcome is read."""
        return self._horizon

    def finished(self, first_id: str, now: float) -> None:
        """A first turn (no id, continued nothing) finished under ``first_id``."""
        self._late.pop(first_id, None)
        self._awaiting.pop(first_id, None)
        latest = next(reversed(self._awaiting.values()), (now,))[0]
        self._awaiting[first_id] = [max(now, latest), False]  # kept in time order
        while len(self._awaiting) > self.max_awaiting:
            self._resolve(*self._awaiting.popitem(last=False))

    def continued(self, first_id: str, now: float) -> None:
        """A request continued ``first_id``'s context (no-op unless it is a first turn watched)."""
        entry = self._awaiting.get(first_id)
        if entry is not None:
            if not entry[1]:
                entry[1] = True
                self._delay(now - entry[0])
            return
        finished = self._late.pop(first_id, None)
        if finished is not None:
            self._delay(now - finished)

    def expire(self, now: float) -> list[str]:
        """Resolve the first turns a horizon old; returns those not continued (single-shot)."""
        cutoff = now - self._horizon
        awaiting, single = self._awaiting, []
        while awaiting and next(iter(awaiting.values()))[0] <= cutoff:
            first_id, entry = awaiting.popitem(last=False)
            if not self._resolve(first_id, entry):
                single.append(first_id)
        late, cutoff = self._late, now - self.return_s
        while late and next(iter(late.values())) <= cutoff:
            late.popitem(last=False)
        return single

    def _resolve(self, first_id: str, entry: list) -> bool:
        finished, continued = entry
        if not continued:
            latest = next(reversed(self._late.values()), finished)
            self._late[first_id] = max(finished, latest)
            if len(self._late) > self.max_awaiting:
                self._late.popitem(last=False)
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen:
            self._continued -= outcomes[0]
        outcomes.append(continued)
        self._continued += continued
        return continued

    def _delay(self, seconds: float) -> None:
        self._delays.append(max(0.0, seconds))
        ordered = sorted(self._delays)
        p90 = ordered[math.ceil(0.9 * (len(ordered) - 1))]  # nearest rank: the longest of a few
        self._horizon = min(self.return_s, max(self.min_horizon_s, HORIZON_FACTOR * p90))

    def check_integrity(self) -> None:
        assert len(self._awaiting) <= self.max_awaiting, "first turns awaiting over the bound"
        assert len(self._late) <= self.max_awaiting, "first turns watched late over the bound"
        for watched in ([e[0] for e in self._awaiting.values()], list(self._late.values())):
            assert all(a <= b for a, b in zip(watched, watched[1:])), "first turns out of time order"
        assert self._continued == sum(self._outcomes), "first-turn outcome count"
        assert self.min_horizon_s <= self._horizon <= self.return_s, "first-turn horizon out of range"
