"""The paper's baseline TTL models, for the lab's variants (``bench/variants.py``); the product's
model is the cost model (``sglang_continuum.core.cost_model``).

* ``FixedTTL``     -- a constant (the static-TTL rung of the paper's ablation).
* ``ReferenceTTL`` -- the public vLLM reference's rule: pin ``pin_s`` if the tool's mean duration
                      is at most ``threshold_s`` (unseen tools get the pin), else none.
* ``BernsteinTTL`` -- the earlier paper version's bound (seed 003, section 4.3).

Each implements ``sglang_continuum.core.ttl.TTLModel`` and takes its parameters as keyword
arguments (``functools.partial`` makes a factory of one for ``core.rules.Rules``). The controller
caps every TTL at ``max_ttl_s``; without the cost model a host copy is protected for a fixed
``host_ttl_s``.
"""

from __future__ import annotations

import math

from sglang_continuum.core.cost_model import SignalModel
from sglang_continuum.core.tool_stats import SampleWindow, ToolStats
from sglang_continuum.core.ttl import TTLModel, TTLQuery

HOST_TTL_S = 60.0


class FixedTTL(TTLModel):
    name = "fixed"

    def __init__(self, settings, stats: ToolStats, *, ttl_s: float = 2.0, host_ttl_s: float = HOST_TTL_S) -> None:
        super().__init__(settings, stats)
        if ttl_s < 0 or host_ttl_s < 0:
            raise ValueError("TTLs must be >= 0")
        self.ttl_s = ttl_s
        self.host_ttl_s = host_ttl_s

    def ttl(self, query: TTLQuery) -> float:
        return self.ttl_s

    def host_ttl(self, query: TTLQuery, elapsed_s: float) -> float:
        return min(self.host_ttl_s, self.max_host_ttl_s)


class ReferenceTTL(FixedTTL):
    """Pin ``ttl_s`` if the tool's running mean is at most ``threshold_s``; unseen tools are pinned."""

    name = "reference"

    def __init__(self, settings, stats: ToolStats, *, ttl_s: float = 2.0, threshold_s: float = 2.0, **kw) -> None:
        super().__init__(settings, stats, ttl_s=ttl_s, **kw)
        self.threshold_s = threshold_s

    def ttl(self, query: TTLQuery) -> float:
        pin_s = super().ttl(query)
        window = self.stats.tool(query.tool)
        if window is None or len(window) == 0:
            return pin_s
        return pin_s if window.mean <= self.threshold_s else 0.0


class BernsteinTTL(SignalModel):
    """Seed 003, section 4.3: ``TTL = T_default^2 / B(f) * (1 + alpha * AvgTurns)`` with B an
    empirical-Bernstein upper bound on the tool's duration
    ``mu + sqrt(2 sigma^2 ln(3/delta) / n) + 3 b ln(3/delta) / n`` (b = the largest sample);
    per tool with at least ``min_samples`` samples, else global, else ``T_default``."""

    name = "bernstein"

    def __init__(
        self,
        settings,
        stats: ToolStats,
        *,
        t_default_s: float = 2.0,
        delta: float = 0.1,
        alpha: float = 0.1,
        min_samples: int = 10,
        host_ttl_s: float = HOST_TTL_S,
    ) -> None:
        super().__init__(settings, stats)
        if not 0 < delta < 1 or alpha < 0 or min_samples < 1 or t_default_s < 0:
            raise ValueError("need 0 < delta < 1, alpha >= 0, min_samples >= 1, t_default_s >= 0")
        self.t_default = t_default_s
        self.delta = delta
        self.alpha = alpha
        self.min_samples = min_samples
        self.host_ttl_s = host_ttl_s

    def bound(self, window: SampleWindow) -> float:
        n = len(window)
        log_term = math.log(3.0 / self.delta)
        b = float(window.sorted[-1])
        return window.mean + math.sqrt(2.0 * window.variance * log_term / n) + 3.0 * b * log_term / n

    def host_ttl(self, query: TTLQuery, elapsed_s: float) -> float:
        return min(self.host_ttl_s, self.max_host_ttl_s)

    def ttl(self, query: TTLQuery) -> float:
        window, _ = self.stats.window_for(query.tool, min_samples=self.min_samples)
        if len(window) < self.min_samples:
            return self.t_default
        bound = self.bound(window)
        if bound <= 0:
            return self.t_default
        return self.t_default**2 / bound * (1.0 + self.alpha * self.eta.mean_turns)
