"""The host tier (HiCache) in the cost model: reload cost and host-side TTL.

With a host copy, a program whose device pin ended loses only a host-to-device transfer, not a
prefill. Two decisions follow, pure functions of the tool-time distribution:

* device TTL: the alternative to a device hit becomes a reload, so ``PrefillReload(r)`` is the
  transfer time (``ReloadCost``) rather than the prefill time (the paper, section 4);
* host TTL: how long to protect the host copy once the device pin ended ``elapsed`` seconds after
  the turn finished. The tool has not returned yet, so the CDF is conditioned on ``t > elapsed``;
  a host hit saves ``Prefill(r) - Reload(r)``, and holding host memory is ``hold_cost`` times as
  expensive as holding device memory (device pool / host pool, so a host twice the device's size
  halves the cost):
  ``argmax over tau of  P(elapsed < t <= elapsed + tau | t > elapsed) * benefit - hold_cost * tau``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from sglang_continuum.core.tool_stats import COLD_START_K, ToolStats
from sglang_continuum.core.ttl import argmax_sorted

# Conservative host-to-device bandwidth when nothing was measured: a quarter of PCIe 4.0 x16's
# practical ~25 GB/s (scattered page copies, shared links). ``continuum-profile --host-bandwidth``
# measures the real figure.
DEFAULT_HOST_BYTES_PER_S = 6e9
DEFAULT_RELOAD_LATENCY_S = 1e-3
HOST_PIN_BUDGET_FRACTION = 0.5  # share of the host pool host pins may hold
MAX_CACHED_TOOLS = 1024


@dataclass(frozen=True, slots=True)
class ReloadCost:
    """Seconds to bring ``n`` tokens of KV back from host memory."""

    bytes_per_token: int
    bytes_per_s: float = DEFAULT_HOST_BYTES_PER_S
    latency_s: float = DEFAULT_RELOAD_LATENCY_S

    def __post_init__(self) -> None:
        if self.bytes_per_token <= 0 or self.bytes_per_s <= 0 or self.latency_s < 0:
            raise ValueError("reload cost needs bytes_per_token > 0, bytes_per_s > 0, latency_s >= 0")

    def seconds(self, tokens: int) -> float:
        return self.latency_s + max(0, tokens) * self.bytes_per_token / self.bytes_per_s


def remaining_samples(sorted_samples: np.ndarray, elapsed: float) -> np.ndarray:
    """Tool times still possible after ``elapsed`` seconds without a return, shifted to start at 0."""
    i = int(np.searchsorted(sorted_samples, elapsed, side="right"))
    return sorted_samples[i:] - elapsed


def host_ttl(
    sorted_samples: Optional[np.ndarray],
    elapsed: float,
    benefit_s: float,
    hold_cost: float,
    *,
    cap_s: float = math.inf,
    cold_mean_s: float = 1.0,
) -> float:
    """Seconds (from now) to protect the host copy; 0 means release it.

    ``sorted_samples=None`` is the cold start: Exp tool times of mean ``cold_mean_s``, memoryless,
    so the conditioned optimum is the unconditioned one, ``m * ln(benefit / (hold_cost * m))``
    when that is positive.
    """
    if benefit_s <= 0:
        return 0.0
    ratio = benefit_s / hold_cost if hold_cost > 0 else math.inf
    if sorted_samples is None:
        if math.isinf(ratio):
            return cap_s
        m = cold_mean_s
        return min(m * math.log(ratio / m), cap_s) if ratio > m else 0.0
    rest = remaining_samples(sorted_samples, elapsed)
    if rest.size == 0:  # every observed call of this tool has returned by now
        return 0.0
    if math.isinf(ratio):
        return min(float(rest[-1]), cap_s)
    return argmax_sorted(rest, ratio, cap_s=cap_s)


def likely_back_s(sorted_samples: np.ndarray, horizon_s: float, return_p: float = 1.0) -> float:
    """How long a program out on a tool stays more likely than not to be back within ``horizon_s``:
    the first elapsed time ``e`` with ``P(e < T <= e + horizon_s | T > e) < 1/2``, where ``T`` is
    the tool's time (``return_p`` times the samples' CDF; ``inf`` if there is none).

    Recency cannot tell a tool call of seconds from a person reading for minutes; the tool's own
    times can. Admission control counts a program out on a tool in the working set while this
    holds. The conditional probability is a step function whose steps sit at the samples and at
    the samples minus the horizon, so those points are the only candidates.
    """
    n = sorted_samples.size
    if n == 0:
        return math.inf
    first = math.inf
    for e in (np.zeros(1), sorted_samples, np.clip(sorted_samples - horizon_s, 0.0, None)):  # each sorted
        at_e = np.searchsorted(sorted_samples, e, side="right")  # counts: exact ties at 1/2
        by_horizon = np.searchsorted(sorted_samples, e + horizon_s, side="right")
        # 2 * (back within the horizon) < (still out): not likely back (nothing left out: not back)
        unlikely = np.flatnonzero(2 * return_p * (by_horizon - at_e) < n - return_p * at_e + n * (at_e == n))
        if unlikely.size:
            first = min(first, float(e[unlikely[0]]))
    return first


class LikelyBack:
    """``likely_back_s`` for a tool as the statistics stand: its own times once it has
    ``min_samples``, the global times until then, ``inf`` (no opinion) before the global times
    have as many. Cached per tool until its return probability changes or a hundredth of its
    times are new (each costs ``O(n log n)``, ~0.5 ms at 10,000 times)."""

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
        if (
            cached is not None
            and cached[0] == id(window)
            and cached[2] == rho
            and window.version - cached[1] < max(1, len(window) // 100)
        ):
            return cached[3]
        value = likely_back_s(window.sorted, self.horizon_s, rho)
        if len(self._cache) >= MAX_CACHED_TOOLS:
            self._cache.clear()
        self._cache[tool] = (id(window), window.version, rho, value)
        return value
