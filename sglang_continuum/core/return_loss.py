"""Return loss: how much of their context returning programs find gone, the thrash signal.

The signal operating systems watch when working sets do not fit (Denning's page-fault frequency):
the faults. A returning turn whose previous context was ``previous`` tokens and that found
``cached`` of them still in the cache lost ``previous - cached``; over the last ``window``
returning turns, the lost share of their previous contexts is the return loss. Bounded waiting
reads it: while the pool keeps no locality, being overtaken buys a waiting request nothing
(``bounded_waiting.py``). It falls again as the programs in flight come back to hits or finish.
"""

from __future__ import annotations

from collections import deque

RETURN_LOSS_WINDOW = 32  # returning turns the return loss is measured over


class ReturnLossMeter:
    def __init__(self, *, window: int = RETURN_LOSS_WINDOW, min_samples: int = 8) -> None:
        if window < 1 or not 1 <= min_samples <= window:
            raise ValueError("need window >= 1 and 1 <= min_samples <= window")
        self.window = window
        self.min_samples = min_samples
        self._samples: deque[tuple[int, int]] = deque()  # (previous context, lost tokens), oldest first
        self._previous = 0
        self._lost = 0
        self.observed = 0  # returning turns seen, ever

    def observe(self, previous_tokens: int, cached_tokens: int) -> None:
        """A returning turn was admitted: its program's context was ``previous_tokens`` when its last
        turn finished, and ``cached_tokens`` of its prompt were found cached (device or host)."""
        if previous_tokens <= 0:
            return
        lost = max(0, previous_tokens - max(0, cached_tokens))
        self._samples.append((previous_tokens, lost))
        self._previous += previous_tokens
        self._lost += lost
        if len(self._samples) > self.window:
            old_previous, old_lost = self._samples.popleft()
            self._previous -= old_previous
            self._lost -= old_lost
        self.observed += 1

    @property
    def ratio(self) -> float:
        """The lost share of returning programs' previous contexts over the window (0 when empty)."""
        return self._lost / self._previous if self._previous else 0.0

    @property
    def ready(self) -> bool:
        """Enough returning turns in the window for the ratio to mean something."""
        return len(self._samples) >= self.min_samples

    def reset(self) -> None:
        """The cache was flushed: the losses it causes say nothing about the pool's load."""
        self._samples.clear()
        self._previous = self._lost = 0

    def check_integrity(self) -> None:
        assert len(self._samples) <= self.window, "return-loss window overflow"
        assert self._previous == sum(p for p, _ in self._samples), "return-loss previous-token sum"
        assert self._lost == sum(lost for _, lost in self._samples), "return-loss lost-token sum"
        assert 0 <= self._lost <= self._previous, "return loss outside [0, previous]"


RELEASE_LOSS_PRIOR = 1.0  # before a release is seen: while the door binds, the room it frees is a held turn's at once
# a sample older than this says nothing of the pool now: ten pin lifetimes at the default max_ttl_s,
# in which every program in flight has been pinned, let go or come back several times
RELEASE_LOSS_HORIZON_S = 300.0


class ReleaseLossMeter:
    """The share of a context let go that its return found gone, over the last ``window`` returns
    seen within ``horizon_s``; ``prior`` while fewer than ``min_samples`` are. The horizon keeps an
    old pool from pricing today's: releases seen while the pool had room (their contexts survived)
    stop pricing residency out once it fills and residency keeps the programs, so that no release
    is seen any more. The prior is what a binding door makes of a release (residency is priced only
    while it binds): the room it frees is a held turn's at once. A neutral one (half lost) priced
    residency out where it is worth 1.5x (recorded Claude Code, 16 sessions, emulated)."""

    def __init__(
        self,
        *,
        window: int = RETURN_LOSS_WINDOW,
        min_samples: int = 8,
        horizon_s: float = RELEASE_LOSS_HORIZON_S,
        prior: float = RELEASE_LOSS_PRIOR,
    ) -> None:
        if window < 1 or not 1 <= min_samples <= window or horizon_s <= 0 or not 0.0 <= prior <= 1.0:
            raise ValueError("need window >= 1, 1 <= min_samples <= window, horizon_s > 0, 0 <= prior <= 1")
        self.window, self.min_samples, self.horizon_s, self.prior = window, min_samples, horizon_s, prior
        self._samples: deque[tuple[float, int, int]] = deque()  # (when, previous context, lost), oldest first
        self._previous = 0
        self._lost = 0
        self.observed = 0  # releases seen, ever

    def observe(self, previous_tokens: int, cached_tokens: int, now: float) -> None:
        if previous_tokens <= 0:
            return
        lost = max(0, previous_tokens - max(0, cached_tokens))
        self.observed += 1
        self._samples.append((now, previous_tokens, lost))
        self._previous += previous_tokens
        self._lost += lost
        if len(self._samples) > self.window:
            self._drop()

    def expire(self, now: float) -> None:
        """Forget the samples older than the horizon."""
        cutoff = now - self.horizon_s
        while self._samples and self._samples[0][0] < cutoff:
            self._drop()

    @property
    def ready(self) -> bool:
        return len(self._samples) >= self.min_samples

    @property
    def measured(self) -> float:
        """The lost share over the samples held, however few (0 when none)."""
        return self._lost / self._previous if self._previous else 0.0

    @property
    def ratio(self) -> float:
        return self.measured if self.ready else self.prior

    def reset(self) -> None:
        self._samples.clear()
        self._previous = self._lost = 0

    def _drop(self) -> None:
        _, previous, lost = self._samples.popleft()
        self._previous -= previous
        self._lost -= lost

    def check_integrity(self) -> None:
        assert len(self._samples) <= self.window, "release-loss window overflow"
        assert self._previous == sum(p for _, p, _ in self._samples), "release-loss previous-token sum"
        assert self._lost == sum(lost for _, _, lost in self._samples), "release-loss lost-token sum"
        assert 0 <= self._lost <= self._previous, "release loss outside [0, previous]"
