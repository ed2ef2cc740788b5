"""How long a program out on a tool call will stay out: the tool's learned durations, blended with
the client's hint (``metadata.TOOL_TIME_KEY``) as Tokencake blends a developer's ``predict_time``
with its history, ``t = a * hint + (1 - a) * learned``.

A hint moves the learned distribution, it does not replace it: the samples are scaled so that their
mean is the blend, which keeps their spread (a tool whose calls vary keeps varying). With no samples
the hint is all there is: a point mass. Without a hint nothing here changes what was learned.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from sglang_continuum.core.tool_stats import ToolStats

HINT_WEIGHT = 0.5  # a: how much the client's forecast counts against the learned mean
FORECAST_MIN_SAMPLES = 8  # the tool's own samples read once it has this many, else every tool's


class ToolForecast:
    def __init__(self, stats: ToolStats, hint_weight: float = HINT_WEIGHT) -> None:
        if not 0.0 <= hint_weight <= 1.0:
            raise ValueError("hint_weight must be in [0, 1]")
        self.stats = stats
        self.hint_weight = hint_weight

    def durations(self, tool: Optional[str], hint_s: Optional[float]) -> Optional[np.ndarray]:
        """The call's possible durations, sorted; None when nothing is known (no sample, no hint)."""
        window, _ = self.stats.window_for(tool, min_samples=FORECAST_MIN_SAMPLES)
        learned = window.sorted if len(window) else None
        if hint_s is None:
            return learned
        if learned is None or not window.mean > 0:
            return np.array([float(hint_s)])
        target = self.hint_weight * hint_s + (1.0 - self.hint_weight) * window.mean
        return learned * (target / window.mean)

    def remaining(self, tool: Optional[str], hint_s: Optional[float], elapsed_s: float) -> Optional[np.ndarray]:
        """What is left of the call after ``elapsed_s`` without a return, sorted (from 0). A call
        out longer than every forecast may end any moment: ``[0]``."""
        durations = self.durations(tool, hint_s)
        if durations is None:
            return None
        rest = durations[int(np.searchsorted(durations, elapsed_s, side="right")) :] - elapsed_s
        return rest if rest.size else np.zeros(1)

    def median_remaining(self, tool: Optional[str], hint_s: Optional[float], elapsed_s: float) -> Optional[float]:
        rest = self.remaining(tool, hint_s, elapsed_s)
        return None if rest is None else float(rest[(rest.size - 1) // 2])
