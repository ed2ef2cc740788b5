"""TTL models: how long to pin a program's prefix after a non-final turn.

One interface, ``TTLModel``: ``ttl(query) -> seconds`` (0 means "do not pin") plus explicit,
defaulted hooks for the signals a model may learn from. The product's model is the paper's cost
model (``cost_model.py``); the paper's baselines (fixed, the public reference's rule, the earlier
version's Bernstein bound) are the lab's (``continuum_lab.bench.ttl_baselines``), for its variants
(``core/rules.py`` composes a model with a queue order).

Every TTL is at most ``max_ttl_s``: a model that optimises picks the best candidate within the cap
(capping an unconstrained optimum afterwards can give a pin that never pays off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

import numpy as np

from sglang_continuum.core.forecast import ToolForecast
from sglang_continuum.core.tool_stats import ToolStats

if TYPE_CHECKING:
    from sglang_continuum.core.engine_time import EngineTime


class Reload(Protocol):
    """What a TTL model reads of the host tier's transfer-time model (``offload.ReloadCost``)."""

    def seconds(self, tokens: int) -> float: ...


class TTLSettings(Protocol):
    """What a TTL model reads of the operator's settings (``ContinuumSettings`` has both)."""

    max_ttl_s: float
    prefill_profile: Optional[str]


@dataclass(frozen=True, slots=True)
class TTLQuery:
    tool: str  # tool the finished turn called ("unknown" when it could not be identified)
    context_tokens: int  # tokens the pin would keep (the program's whole context so far)
    hint_s: Optional[float] = None  # the client's forecast of the call's duration (``forecast.py``)


class TTLModel:
    """Base of every TTL model. Subclasses implement ``ttl``; the hooks default to "ignore"."""

    name = "base"

    def __init__(self, settings: TTLSettings, stats: ToolStats) -> None:
        self.settings = settings
        self.stats = stats
        self.forecast = ToolForecast(stats)  # the learned durations, blended with a client's hint
        self.reload: Optional[Reload] = None  # set when a host tier (HiCache) is attached
        self.host_hold_cost = 1.0
        self.max_host_ttl_s = 0.0  # the longest host TTL (with a host tier)
        # share of pins that survived until their program came back (hits / (hits + sheds of
        # programs that came back), Laplace-smoothed); the controller keeps it current
        self.pin_survival = 1.0

    def ttl(self, query: TTLQuery) -> float:
        raise NotImplementedError

    # -- signals (what a statistical model learns from besides tool times) ---------------
    def observe_queue_delay(self, seconds: float) -> None:
        """A returning turn that missed its prefix waited ``seconds`` from arrival to admission."""

    def observe_program_end(self, n_turns: int) -> None:
        """A program ended after ``n_turns`` turns (last step, or forgotten while idle)."""

    def rebuild_s(self, context_tokens: int) -> float:
        """Seconds a device miss costs besides queueing (recompute, or reload from host)."""
        return 0.0

    def prefill_s(self, context_tokens: int) -> float:
        """Seconds to prefill ``context_tokens`` from nothing (0: the model does not price it)."""
        return 0.0

    def read_engine(self, engine: "EngineTime") -> None:
        """The engine's own step timings (``engine_time.py``), for a model that prices a rebuild
        without a measured profile."""

    # -- host tier -----------------------------------------------------------------------
    def use_host_tier(self, reload: Reload, hold_cost: float, max_host_ttl_s: float) -> None:
        """A miss now costs a reload, not a prefill; host memory costs ``hold_cost`` x device's; a
        host copy is protected for at most ``max_host_ttl_s``."""
        self.reload = reload
        self.host_hold_cost = hold_cost
        self.max_host_ttl_s = max_host_ttl_s

    def host_ttl(self, query: TTLQuery, elapsed_s: float) -> float:
        """Seconds to protect the host copy once the device pin ended ``elapsed_s`` after the turn
        (0: do not protect it)."""
        return 0.0

    # -- warm start ----------------------------------------------------------------------
    def signals(self) -> dict:
        """What the model learned besides tool times (saved with the statistics)."""
        return {}

    def load_signals(self, signals: dict) -> None:
        """Restore what ``signals`` saved (warm start)."""


def optimal_ttl(samples, benefit_s: float, cap_s: float = math.inf) -> float:
    """``argmax over tau in {0} U samples, tau <= cap_s, of  P(tau) * benefit_s - tau`` for one
    empirical CDF.

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
    return argmax_sorted(s, float(benefit_s), cap_s=cap_s)


def argmax_sorted(
    s: np.ndarray, benefit_s: float, ranks: Optional[np.ndarray] = None, *, cap_s: float = math.inf
) -> float:
    """``optimal_ttl`` for samples already sorted; ``ranks`` (i/n) may be passed in cached."""
    n = s.size
    if ranks is None:
        ranks = np.arange(1, n + 1, dtype=np.float64) / n
    k = n if math.isinf(cap_s) else int(np.searchsorted(s, cap_s, side="right"))
    if k == 0:
        return 0.0
    # For a run of equal samples the last index has the largest P, so a plain argmax over all
    # indices already evaluates each distinct candidate at its true CDF value.
    obj = ranks[:k] * benefit_s - s[:k]
    i = int(np.argmax(obj))
    return float(s[i]) if obj[i] > 0.0 else 0.0
