"""Where the engine's time goes: the share of its busy time spent in decode steps, learned from the
scheduler's own steps.

A place left empty in the batch costs only decode: a decode step runs every sequence of the batch at
about the price of one (the weights are read once), while a prefill costs per token, batched or not.
On an engine that spends most of its time prefilling (long prompts, short answers, a slow CPU) an
empty place costs little; on a decode-bound one it costs its share of every step. The door prices
keeping a program resident with it (``Door.keeping_pays``).

Fed once per scheduler iteration with the step clock and the mode of the batch that ran since the
last one (the overlap loop launches a batch per iteration, so the interval is about that batch's
time); idle intervals are not the engine's and are skipped.
"""

from __future__ import annotations

from typing import Optional

HALF_LIFE_S = 60.0  # of engine busy time: the share follows a workload that changes within minutes
MIN_BUSY_S = 1.0  # before this much busy time is seen the share is 1 (every place priced as decode)
MAX_STEP_S = 30.0  # a longer interval is the loop waiting, not a step


class EngineTime:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.decode_s = 0.0  # decayed busy seconds in decode steps
        self.busy_s = 0.0  # decayed busy seconds in any step
        self._last: Optional[float] = None

    @property
    def decode_share(self) -> float:
        """The decayed share of busy time spent in decode steps (1 until ``MIN_BUSY_S`` is seen)."""
        if self.busy_s < MIN_BUSY_S:
            return 1.0
        return self.decode_s / self.busy_s

    def step(self, now: float, ran: Optional[bool]) -> None:
        """One scheduler iteration at ``now``; ``ran``: what ran since the last one (True a decode
        batch, False a prefill or mixed one, None nothing)."""
        last, self._last = self._last, now
        if last is None or ran is None:
            return
        seconds = now - last
        if not 0.0 < seconds <= MAX_STEP_S:
            return
        keep = 0.5 ** (seconds / self.half_life_s)
        self.decode_s = self.decode_s * keep + (seconds if ran else 0.0)
        self.busy_s = self.busy_s * keep + seconds

    def check_integrity(self) -> None:
        assert 0.0 <= self.decode_s <= self.busy_s + 1e-9, "decode time beyond busy time"
