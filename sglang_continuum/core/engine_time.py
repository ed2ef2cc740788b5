"""Where the engine's time goes, learned from the scheduler's own steps: the share of its busy time
spent in decode steps, and what a prefilled token costs.

A place left empty in the batch costs only decode: a decode step runs every sequence of the batch at
about the price of one (the weights are read once), while a prefill costs per token, batched or not.
On an engine that spends most of its time prefilling (long prompts, short answers, a slow CPU) an
empty place costs little; on a decode-bound one it costs its share of every step. The door prices
keeping a program resident with it (``Door.keeping_pays``).

A lost context costs its re-prefill. Without a measured prefill profile the TTL model prices it at
the engine's own rate (``prefill_s_per_token``): the prefill steps' seconds over the tokens they
prefilled. Those steps extend contexts behind cached prefixes, as a rebuild's chunks do, so the
rate carries the attention over the prefix at the sizes this workload has.

Fed once per scheduler iteration with the step clock and what ran since the last one (the overlap
loop launches a batch per iteration, so the interval is about that batch's time); idle intervals
are not the engine's and are skipped. Everything decays with the engine's busy time.
"""

from __future__ import annotations

from typing import Optional

HALF_LIFE_S = 60.0  # of engine busy time: the figures follow a workload that changes within minutes
MIN_BUSY_S = 1.0  # before this much busy time is seen the share is 1 (every place priced as decode)
MIN_PREFILL_TOKENS = 4096  # before this many prefilled tokens are seen (decayed) the rate is unknown
MAX_STEP_S = 30.0  # a longer interval is the loop waiting, not a step


class EngineTime:
    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.decode_s = 0.0  # decayed busy seconds in decode steps
        self.busy_s = 0.0  # decayed busy seconds in any step
        self.prefill_s = 0.0  # decayed busy seconds in prefill (or mixed) steps
        self.prefill_tokens = 0.0  # decayed tokens those steps prefilled
        self._last: Optional[float] = None

    @property
    def decode_share(self) -> float:
        """The decayed share of busy time spent in decode steps (1 until ``MIN_BUSY_S`` is seen)."""
        if self.busy_s < MIN_BUSY_S:
            return 1.0
        return self.decode_s / self.busy_s

    @property
    def prefill_s_per_token(self) -> Optional[float]:
        """Seconds of engine time a prefilled token costs (None until ``MIN_PREFILL_TOKENS`` are seen)."""
        if self.prefill_tokens < MIN_PREFILL_TOKENS:
            return None
        return self.prefill_s / self.prefill_tokens

    def step(self, now: float, ran: Optional[bool], prefilled_tokens: int = 0) -> None:
        """One scheduler iteration at ``now``; ``ran``: what ran since the last one (True a decode
        batch, False a prefill or mixed one of ``prefilled_tokens`` tokens, None nothing)."""
        last, self._last = self._last, now
        if last is None or ran is None:
            return
        seconds = now - last
        if not 0.0 < seconds <= MAX_STEP_S:
            return
        keep = 0.5 ** (seconds / self.half_life_s)
        prefill = not ran and prefilled_tokens > 0
        self.decode_s = self.decode_s * keep + (seconds if ran else 0.0)
        self.busy_s = self.busy_s * keep + seconds
        self.prefill_s = self.prefill_s * keep + (seconds if prefill else 0.0)
        self.prefill_tokens = self.prefill_tokens * keep + (prefilled_tokens if prefill else 0)

    def check_integrity(self) -> None:
        assert 0.0 <= self.decode_s <= self.busy_s + 1e-9, "decode time beyond busy time"
        assert 0.0 <= self.prefill_s <= self.busy_s - self.decode_s + 1e-9, "prefill time beyond non-decode time"
        assert self.prefill_tokens >= 0.0, "negative prefilled tokens"
