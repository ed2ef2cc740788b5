"""Door experiments, each a ``Rules`` variant: nothing of the controller changes.

``per_tool_window``: with a host tier, a program out on a tool leaves the door's working set once its
tool's own times say it is no longer likely back within the window (a person's turn after seconds,
a tool call at the window), instead of staying the whole ``HOST_TIER_WORKING_SET_WINDOW_S``.
Measured neutral where it acts (recorded Claude Code, 96 sessions, raw gaps, seeds 1-3), so it is
not the product's door; it is kept here as the worked example of a door variant.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Optional

import numpy as np

from sglang_continuum.core.door import HOST_TIER_WORKING_SET_WINDOW_S, WorkingSet
from sglang_continuum.core.programs import ProgramState
from sglang_continuum.core.residency import Residency
from sglang_continuum.core.rules import Rules
from sglang_continuum.core.tool_stats import ToolStats

COLD_START_K = 100  # samples a tool needs before its own times are read (the cost model's K)
MAX_CACHED_TOOLS = 1024


def likely_back_s(sorted_samples: np.ndarray, horizon_s: float, return_p: float = 1.0) -> float:
    """How long a program out on a tool stays more likely than not to be back within ``horizon_s``:
    the first elapsed time ``e`` with ``P(e < T <= e + horizon_s | T > e) < 1/2``, ``T`` the tool's
    time (``return_p`` times the samples' CDF; ``inf`` with no samples). The conditional
    probability is a step function stepping at the samples and at the samples minus the horizon,
    so those are the only candidates."""
    n = sorted_samples.size
    if n == 0:
        return math.inf
    first = math.inf
    for e in (np.zeros(1), sorted_samples, np.clip(sorted_samples - horizon_s, 0.0, None)):
        at_e = np.searchsorted(sorted_samples, e, side="right")
        by_horizon = np.searchsorted(sorted_samples, e + horizon_s, side="right")
        unlikely = np.flatnonzero(2 * return_p * (by_horizon - at_e) < n - return_p * at_e + n * (at_e == n))
        if unlikely.size:
            first = min(first, float(e[unlikely[0]]))
    return first


class LikelyBack:
    """``likely_back_s`` for a tool as its statistics stand (its own times once it has
    ``min_samples``, else the global ones; ``inf`` before those have as many), cached per tool
    until its return probability changes or a hundredth of its times are new."""

    def __init__(self, stats: ToolStats, horizon_s: float, *, min_samples: int = COLD_START_K + 1) -> None:
        self.stats = stats
        self.horizon_s = horizon_s
        self.min_samples = min_samples
        self._cache: dict[str, tuple[int, int, float, float]] = {}  # tool: (window, version, rho, value)

    def __call__(self, tool: str) -> float:
        window, _ = self.stats.window_for(tool, min_samples=self.min_samples)
        if len(window) < self.min_samples:
            return math.inf
        rho = self.stats.return_probability(tool)
        cached = self._cache.get(tool)
        fresh = window.version - cached[1] < max(1, len(window) // 100) if cached else False
        if cached is not None and cached[0] == id(window) and cached[2] == rho and fresh:
            return cached[3]
        value = likely_back_s(window.sorted, self.horizon_s, rho)
        if len(self._cache) >= MAX_CACHED_TOOLS:
            self._cache.clear()
        self._cache[tool] = (id(window), window.version, rho, value)
        return value


class LikelyBackWorkingSet(WorkingSet):
    """The working set, less a program out on a tool it is not likely back from soon."""

    def __init__(self) -> None:
        super().__init__()
        self.likely_back: Optional[LikelyBack] = None  # set with a host tier
        self._leaving: list[tuple[float, int, ProgramState, float]] = []  # (when, seq, program, its finish)
        self._seq = itertools.count()

    def went_out(self, state: ProgramState, now: float) -> None:
        if self.likely_back is None or state.pending_tool is None or state.in_flight > 0:
            return
        stay = self.likely_back(state.pending_tool)
        if stay < self.window_s:
            heapq.heappush(self._leaving, (now + stay, next(self._seq), state, now))

    def expire(self, now, touch) -> None:
        super().expire(now, touch)
        while self._leaving and self._leaving[0][0] <= now:
            _, _, state, finished = heapq.heappop(self._leaving)
            if state.last_finish == finished and state.in_flight == 0:  # still out on that call
                self.let_go(state)


class LikelyBackResidency(Residency):
    def __init__(self, enabled: bool, stats: Optional[ToolStats] = None, rebuild_s=None, **bounds) -> None:
        super().__init__(enabled, stats, rebuild_s, working_set=LikelyBackWorkingSet(), **bounds)

    def use_host_tier(self) -> None:
        super().use_host_tier()
        if self.stats is not None:
            self.working_set.likely_back = LikelyBack(self.stats, HOST_TIER_WORKING_SET_WINDOW_S)


PER_TOOL_WINDOW = Rules("per-tool-window", residency=LikelyBackResidency)
