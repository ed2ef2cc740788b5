"""Where the engine's time goes, learned from the scheduler's own steps: the share of its busy time
spent in decode steps, and what a prefill costs.

A place left empty in the batch costs only decode: a decode step runs every sequence of the batch at
about the price of one (the weights are read once), while a prefill costs per token, batched or not.
On an engine that spends most of its time prefilling (long prompts, short answers, a slow CPU) an
empty place costs little; on a decode-bound one it costs its share of every step. The door prices
keeping a program resident with it (``Door.keeping_pays``).

A lost context costs its re-prefill. Without a measured prefill profile the TTL model prices it
with the engine's own (``PrefillFit``): a prefill step's seconds fitted as ``c0 + c1 * tokens + c2
* pairs``, the form ``continuum-profile`` measures, where ``pairs`` is what causal attention
computes for ``e`` new tokens behind a cached prefix ``p``, ``e^2 + 2ep`` summed over the batch.
Rebuilding ``n`` tokens from nothing is then ``c0 + c1 * n + c2 * n^2`` (chunks add up to it).
With a host tier, a step that loaded host KV back before it ran (HiCache's load-back: the forward
waits on the copy layer by layer) carries a fourth term, ``c3 * loaded``; ``c3`` is what a reload
costs the engine per token, where the copy is not hidden behind the compute.

Fed once per scheduler iteration with the step clock and what ran since the last one (the overlap
loop launches a batch per iteration, so the interval is about that batch's time); idle intervals
are not the engine's and are skipped. Everything decays with the engine's busy time.
"""

from __future__ import annotations

import itertools
from typing import Optional

import numpy as np

HALF_LIFE_S = 60.0  # of engine busy time: the figures follow a workload that changes within minutes
MIN_BUSY_S = 1.0  # before this much busy time is seen the share is 1 (every place priced as decode)
MIN_PREFILL_TOKENS = 4096  # before this many prefilled tokens (decayed) are seen the fit says nothing
MIN_PREFILL_STEPS = 8.0  # ... nor before this many prefill steps (decayed)
MIN_LOADED_TOKENS = 4096  # before this many host-loaded tokens (decayed) are seen a reload is not priced
MIN_LOAD_STEPS = 4.0  # ... nor before this many steps that loaded (decayed)
MAX_STEP_S = 30.0  # a longer interval is the loop waiting, not a step
REFIT_STEPS = 8  # the fit is solved again once this many prefill steps were added (it moves slowly)


def _subsets(terms: int) -> list[list[int]]:
    """The fit's terms, each kept or dropped: every non-empty subset, the full model first."""
    return [list(s) for n in range(terms, 0, -1) for s in itertools.combinations(range(terms), n)]


_SUBSETS = {3: _subsets(3), 4: _subsets(4)}  # without loads seen, and with


class PrefillFit:
    """Decayed least squares of a prefill step's seconds on (1, tokens, attention pairs, host-loaded
    tokens), with coefficients kept non-negative (the best fit over the subsets of terms whose
    solution is). Until a step loads from host the fourth term is left out: the fit is then the
    three-term one."""

    def __init__(self) -> None:
        self.gram = np.zeros((4, 4))  # decayed sum of x x^T over steps, x = (1, tokens, pairs, loaded)
        self.moment = np.zeros(4)  # decayed sum of x * seconds
        self.load_steps = 0.0  # decayed count of the steps that loaded from host
        self.square = 0.0  # decayed sum of seconds^2
        self.version = 0  # counts the prefill steps added (decay scales the sums alike: the fit stays)
        self._keep = 1.0  # decay not applied to the sums yet (most steps decode: applied when read)
        self._solved: tuple[int, Optional[np.ndarray]] = (-1, None)

    @property
    def steps(self) -> float:
        return float(self.gram[0, 0]) * self._keep

    @property
    def tokens(self) -> float:
        return float(self.gram[0, 1]) * self._keep

    @property
    def loaded_tokens(self) -> float:
        return float(self.gram[0, 3]) * self._keep

    def decay(self, keep: float) -> None:
        self._keep *= keep

    def _settle(self) -> None:
        if self._keep != 1.0:
            self.gram *= self._keep
            self.moment *= self._keep
            self.square *= self._keep
            self.load_steps *= self._keep
            self._keep = 1.0

    def add(self, seconds: float, tokens: int, pairs: int, loaded: int = 0) -> None:
        self._settle()
        x = np.array([1.0, float(tokens), float(pairs), float(loaded)])
        self.gram += np.outer(x, x)
        self.moment += x * seconds
        self.square += seconds * seconds
        self.load_steps += 1.0 if loaded > 0 else 0.0
        self.version += 1

    def coefficients(self) -> Optional[np.ndarray]:
        """``(c0, c1, c2)``, or None before ``MIN_PREFILL_TOKENS`` in ``MIN_PREFILL_STEPS`` are seen."""
        c = self._coefficients()
        return None if c is None else c[:3]

    def _coefficients(self) -> Optional[np.ndarray]:
        if self.tokens < MIN_PREFILL_TOKENS or self.steps < MIN_PREFILL_STEPS:
            return None
        solved_at, _ = self._solved
        if solved_at < 0 or self.version - solved_at >= REFIT_STEPS:
            self._solved = (self.version, self._solve())
        return self._solved[1]

    def seconds(self, tokens: int) -> Optional[float]:
        """Seconds to prefill ``tokens`` from nothing (None: not known yet)."""
        c = self.coefficients()
        return None if c is None else float(c[0] + c[1] * tokens + c[2] * tokens * tokens)

    def load_seconds_per_token(self) -> Optional[float]:
        """What a step pays per token it loads from host (None: too few loads seen to say)."""
        if self.loaded_tokens < MIN_LOADED_TOKENS or self.load_steps * self._keep < MIN_LOAD_STEPS:
            return None
        c = self._coefficients()
        return None if c is None else float(c[3])

    def _solve(self) -> Optional[np.ndarray]:
        subsets = _SUBSETS[4 if self.gram[3, 3] > 0 else 3]
        full = self._fit(subsets[0])
        if full is not None:  # the usual case: every term pays its way
            return full if full.any() else None
        best, best_residual = None, float("inf")
        for terms in subsets[1:]:
            c = self._fit(terms)
            if c is None:
                continue
            residual = self.square - 2 * c @ self.moment + c @ self.gram @ c
            if residual < best_residual - 1e-12 * max(1.0, self.square):
                best, best_residual = c, residual
        return best if best is not None and best.any() else None

    def _fit(self, terms: list[int]) -> Optional[np.ndarray]:
        """Least squares on ``terms`` alone (None: singular, or a coefficient came out negative)."""
        g, m = self.gram[np.ix_(terms, terms)], self.moment[terms]
        scale = np.sqrt(np.diag(g))
        if np.any(scale <= 0):
            return None
        try:
            y = np.linalg.solve(g / np.outer(scale, scale), m / scale)
        except np.linalg.LinAlgError:
            return None
        c = np.zeros(4)
        c[terms] = y / scale
        return c if np.all(c >= 0) and np.all(np.isfinite(c)) else None


class EngineTime:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.decode_s = 0.0  # decayed busy seconds in decode steps
        self.busy_s = 0.0  # decayed busy seconds in any step
        self.prefill = PrefillFit()  # what a prefill step costs
        self._last: Optional[float] = None

    @property
    def decode_share(self) -> float:
        """The decayed share of busy time spent in decode steps (1 until ``MIN_BUSY_S`` is seen)."""
        if self.busy_s < MIN_BUSY_S:
            return 1.0
        return self.decode_s / self.busy_s

    def step(self, now: float, ran: Optional[bool], prefilled: tuple[int, ...] = (0, 0)) -> None:
        """One scheduler iteration at ``now``; ``ran``: what ran since the last one (True a decode
        batch, False a prefill or mixed one, None nothing); ``prefilled``: that prefill's new tokens,
        attention pairs and, with a host tier, the tokens loaded from host for it."""
        last, self._last = self._last, now
        if last is None or ran is None:
            return
        seconds = now - last
        if not 0.0 < seconds <= MAX_STEP_S:
            return
        keep = 0.5 ** (seconds / self.half_life_s)
        self.decode_s = self.decode_s * keep + (seconds if ran else 0.0)
        self.busy_s = self.busy_s * keep + seconds
        self.prefill.decay(keep)
        if not ran and prefilled[0] > 0:
            self.prefill.add(seconds, *prefilled)

    def check_integrity(self) -> None:
        assert 0.0 <= self.decode_s <= self.busy_s + 1e-9, "decode time beyond busy time"
        assert self.prefill.steps >= 0.0 and self.prefill.tokens >= 0.0, "negative prefill sums"
        assert 0.0 <= self.prefill.load_steps <= self.prefill.gram[0, 0] + 1e-9, "more load steps than steps"
