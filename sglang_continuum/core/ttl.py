"""TTL models: how long to pin a program's prefix after a non-final turn.

One small interface (``TTLModel.ttl(query) -> seconds``, 0 meaning "do not pin") with several
implementations selectable by name (``TTL_MODELS``):

* ``fixed``     -- a constant (ablations, and the simplest thing that can work).
* ``reference`` -- the public vLLM reference's rule: pin 2.0 s if the tool's mean duration is at
                   most 2.0 s (unseen tools get the pin), else none.
* ``cost``      -- the paper's cost model (section 4): see ``cost_model.py``.
* ``bernstein`` -- the earlier paper version's bound (seed 003, section 4.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import numpy as np

from sglang_continuum.core.tool_stats import ToolStats


@dataclass(frozen=True, slots=True)
class TTLQuery:
    tool: str  # tool the finished turn called ("unknown" when it could not be identified)
    context_tokens: int  # tokens the pin would keep (the program's whole context so far)


class TTLModel(Protocol):
    name: str

    def ttl(self, query: TTLQuery) -> float: ...


def optimal_ttl(samples, benefit_s: float) -> float:
    """``argmax over tau in {0} U samples of  P(tau) * benefit_s - tau`` for one empirical CDF.

    ``P(tau)`` is the fraction of samples <= tau. Samples and the result are in seconds. Ties go
    to the smaller tau (pinning longer for the same value only costs memory).
    """
    s = np.asarray(samples, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError("samples must be one-dimensional")
    if s.size == 0 or not benefit_s > 0:
        return 0.0
    if not np.all(np.diff(s) >= 0):
        s = np.sort(s)
    return _argmax_sorted(s, float(benefit_s))


def _argmax_sorted(s: np.ndarray, benefit_s: float, ranks: Optional[np.ndarray] = None) -> float:
    n = s.size
    if ranks is None:
        ranks = np.arange(1, n + 1, dtype=np.float64) / n
    # For a run of equal samples the last index has the largest P, so a plain argmax over all
    # indices already evaluates each distinct candidate at its true CDF value.
    obj = ranks * benefit_s - s
    i = int(np.argmax(obj))
    return float(s[i]) if obj[i] > 0.0 else 0.0


@dataclass
class FixedTTL:
    seconds: float = 2.0
    name: str = "fixed"

    def __post_init__(self) -> None:
        if self.seconds < 0:
            raise ValueError("fixed TTL must be >= 0")

    def ttl(self, query: TTLQuery) -> float:
        return self.seconds


@dataclass
class ReferenceTTL:
    """Pin ``pin_s`` if the tool's running mean is at most ``threshold_s``; unseen tools are pinned."""

    stats: ToolStats
    pin_s: float = 2.0
    threshold_s: float = 2.0
    name: str = "reference"

    def ttl(self, query: TTLQuery) -> float:
        window = self.stats.tool(query.tool)
        if window is None or len(window) == 0:
            return self.pin_s
        return self.pin_s if window.mean <= self.threshold_s else 0.0


TTLFactory = Callable[..., TTLModel]
TTL_MODELS: dict[str, TTLFactory] = {}


def register_ttl_model(name: str, factory: TTLFactory) -> None:
    if name in TTL_MODELS:
        raise ValueError(f"TTL model {name!r} is already registered")
    TTL_MODELS[name] = factory


register_ttl_model("fixed", lambda *, settings, stats, **_: FixedTTL(settings.fixed_ttl_s))
register_ttl_model(
    "reference",
    lambda *, settings, stats, **_: ReferenceTTL(
        stats, pin_s=settings.reference_pin_s, threshold_s=settings.reference_threshold_s
    ),
)
