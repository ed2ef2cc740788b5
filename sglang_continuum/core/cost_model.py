"""The paper's TTL cost model (Continuum, section 4): the product's TTL model.

    tau* = argmax over tau in {0} U samples of  P(tau, f) * (T * eta + PrefillReload(r)) - tau

* ``P(tau, f) = rho_f * F_f(tau)``: the empirical CDF of tool ``f``'s durations (``ToolStats``
  windows, kept sorted), times the probability that a program comes back from ``f`` at all
  (``ToolStats.return_probability``; 1 until programs are seen to end while out on ``f``).
  Scaling P by rho is scaling the benefit by rho, which is how it is computed.
* ``T``: sliding-window mean queueing delay of returning turns that missed their prefix.
* ``eta = -Corr(k, N - k)`` over completed programs (k turns served, N total): 1 for fixed-length
  programs, about 0 for memoryless ones; it scales how much of T a hit really saves.
* ``PrefillReload(r)``: seconds to rebuild the context: prefill (the measured ``PrefillProfile``
  where one is configured, else the engine's own, fitted to its prefill steps in the same form,
  ``engine_time.py``, else a built-in guess), or with a host tier the host-to-device transfer
  (``ReloadCost``, see ``offload.py``).
* Cold start (threshold K): ``|S| <= K`` -> the optimum under exponential tool times,
  ``m ln(B / m)`` for ``B > m`` else 0, with ``m`` the mean of the samples seen so far (the
  paper's Exp(1), ``ln(B)``, before the first one); ``|S[f]| <= K`` -> the global CDF; otherwise
  the tool's own. The paper fixes ``m`` = 1 s, a choice of unit: on tools that take 0.2 s and
  misses that cost 0.5 s (the CPU demo, issue 24) it never pins, in minutes it would pin always.
* Every decision's inputs are in ``Decision`` (logged at debug level), and the count of
  decisions per branch, and of those that chose no pin, in ``signals()["decisions"]``.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from sglang_continuum.core.engine_time import EngineTime
from sglang_continuum.core.offload import host_ttl
from sglang_continuum.core.tool_stats import SampleWindow, ToolStats
from sglang_continuum.core.ttl import TTLModel, TTLQuery, argmax_sorted

COLD_START_K = 100  # samples needed before an empirical CDF is trusted (the paper's K)
QUEUE_DELAY_WINDOW = 256  # returning turns that missed, averaged for T
ETA_WINDOW = 1000  # completed programs eta is measured over

logger = logging.getLogger(__name__)


@dataclass
class PrefillProfile:
    """Seconds to prefill ``n`` tokens: ``c0 + c1*n + c2*n^2`` fitted on measured points."""

    coeffs: tuple[float, float, float]
    name: str = "default"
    notes: str = ""
    points: list = field(default_factory=list)
    host_bytes_per_s: Optional[float] = None  # measured host-to-device bandwidth (HiCache reloads)

    def seconds(self, tokens: int) -> float:
        c0, c1, c2 = self.coeffs
        return max(0.0, c0 + c1 * tokens + c2 * tokens * tokens)

    @classmethod
    def load(cls, path: str | Path) -> "PrefillProfile":
        data = json.loads(Path(path).read_text())
        return cls(
            tuple(data["coeffs"]),
            name=data.get("name", Path(path).stem),
            notes=data.get("notes", ""),
            points=data.get("points", []),
            host_bytes_per_s=data.get("host_bytes_per_s"),
        )

    def to_dict(self) -> dict:
        out = {"name": self.name, "coeffs": list(self.coeffs), "points": self.points, "notes": self.notes}
        if self.host_bytes_per_s is not None:
            out["host_bytes_per_s"] = self.host_bytes_per_s
        return out


# Used when no profile is configured, until the engine has prefilled enough for its own fit: about
# 8k tokens/s with a mild quadratic term, a deliberately middle-of-the-road guess. A measured profile
# (continuum-profile, SGLANG_CONTINUUM_PREFILL_PROFILE) also prices contexts longer than any prefilled yet.
DEFAULT_PROFILE = PrefillProfile((0.02, 1.2e-4, 1.0e-9), name="builtin-default")


class SlidingMean:
    def __init__(self, size: int) -> None:
        self._xs: deque[float] = deque(maxlen=size)
        self._sum = 0.0

    def add(self, x: float) -> None:
        if len(self._xs) == self._xs.maxlen:
            self._sum -= self._xs[0]
        self._xs.append(x)
        self._sum += x

    def __len__(self) -> int:
        return len(self._xs)

    @property
    def mean(self) -> float:
        return self._sum / len(self._xs) if self._xs else 0.0


class EtaEstimator:
    """``eta = -Corr(k, N - k)`` over the decision points (k = 1..N-1) of the last programs.

    Each completed program of N turns adds its N-1 decision points; their sums have closed forms,
    so adding or dropping a program is O(1). Undefined correlation (no data, or no spread in k)
    gives the cold-start value 1.
    """

    def __init__(self, window: int = 1000) -> None:
        self._programs: deque[int] = deque(maxlen=window)
        self._s = np.zeros(6)  # n, sum k, sum r, sum k^2, sum r^2, sum k*r

    @staticmethod
    def _sums(n_turns: int) -> np.ndarray:
        m = n_turns - 1
        if m <= 0:
            return np.zeros(6)
        N = float(n_turns)
        sk = m * (m + 1) / 2
        skk = m * (m + 1) * (2 * m + 1) / 6
        sr = m * N - sk
        srr = m * N * N - 2 * N * sk + skk
        skr = N * sk - skk
        return np.array([m, sk, sr, skk, srr, skr])

    def add(self, n_turns: int) -> None:
        if len(self._programs) == self._programs.maxlen:
            self._s -= self._sums(self._programs[0])
        self._programs.append(int(n_turns))
        self._s += self._sums(int(n_turns))

    def __len__(self) -> int:
        return len(self._programs)

    def turn_counts(self) -> list[int]:
        return list(self._programs)

    @property
    def mean_turns(self) -> float:
        return float(np.mean(self._programs)) if self._programs else 0.0

    @property
    def eta(self) -> float:
        n, sk, sr, skk, srr, skr = self._s
        var_k = n * skk - sk * sk
        var_r = n * srr - sr * sr
        if n < 2 or var_k <= 1e-9 * max(1.0, n * skk) or var_r <= 1e-9 * max(1.0, n * srr):
            return 1.0
        return float(-(n * skr - sk * sr) / math.sqrt(var_k * var_r))


class SignalModel(TTLModel):
    """What both statistical models observe besides tool times: T and eta."""

    def __init__(self, settings, stats: ToolStats) -> None:
        super().__init__(settings, stats)
        self.queue_delay = SlidingMean(QUEUE_DELAY_WINDOW)
        self.eta = EtaEstimator(ETA_WINDOW)

    def observe_queue_delay(self, seconds: float) -> None:
        self.queue_delay.add(max(0.0, float(seconds)))

    def observe_program_end(self, n_turns: int) -> None:
        self.eta.add(n_turns)

    def signals(self) -> dict:
        return {
            "queue_delay_mean_s": self.queue_delay.mean,
            "queue_delay_samples": len(self.queue_delay),
            "eta": self.eta.eta,
            "completed_programs": len(self.eta),
            "program_turns": self.eta.turn_counts(),
        }

    def load_signals(self, signals: dict) -> None:
        for n in signals.get("program_turns", []):
            self.eta.add(int(n))


@dataclass(frozen=True, slots=True)
class Decision:
    """One TTL decision and every input it read (logged at debug level, counted in ``signals``)."""

    ttl: float
    source: str  # "cold" | "global" | "tool" | "hint" (the learned durations moved by the client's forecast)
    benefit_s: float  # already scaled by return_p
    samples: int  # samples of the CDF read (global samples on a cold start)
    return_p: float = 1.0
    tool: str = ""
    context_tokens: int = 0
    queue_delay_s: float = 0.0  # T
    queue_delay_samples: int = 0
    eta: float = 1.0
    rebuild_s: float = 0.0  # PrefillReload(r)
    tool_samples: int = 0  # |S[f]|


@dataclass(slots=True)
class DecisionCounts:
    """Decisions per CDF branch, and how many of each chose no pin (ttl 0)."""

    cold: int = 0
    cold_zero: int = 0
    global_cdf: int = 0
    global_cdf_zero: int = 0
    tool_cdf: int = 0
    tool_cdf_zero: int = 0
    hinted: int = 0
    hinted_zero: int = 0

    def add(self, d: Decision) -> None:
        name = {"cold": "cold", "global": "global_cdf", "tool": "tool_cdf", "hint": "hinted"}[d.source]
        setattr(self, name, getattr(self, name) + 1)
        if d.ttl <= 0:
            setattr(self, name + "_zero", getattr(self, name + "_zero") + 1)


class CostModelTTL(SignalModel):
    name = "cost"

    def __init__(
        self, settings, stats: ToolStats, profile: Optional[PrefillProfile] = None, *, cold_start_k: int = COLD_START_K
    ) -> None:
        super().__init__(settings, stats)
        self.k = cold_start_k
        self.profile = profile or DEFAULT_PROFILE
        self.measured = profile is not None
        self.engine: Optional[EngineTime] = None  # the engine's own prefill fit, read without a profile
        self.last: Optional[Decision] = None
        self.decisions = DecisionCounts()
        self._ranks: dict[int, np.ndarray] = {}

    def read_engine(self, engine: EngineTime) -> None:
        if not self.measured:
            self.engine = engine

    def prefill_s(self, context_tokens: int) -> float:
        """Seconds to prefill a context: the measured profile, else the engine's own fit once it
        has prefilled enough to say, else the built-in guess."""
        learned = None if self.engine is None else self.engine.prefill.seconds(context_tokens)
        return self.profile.seconds(context_tokens) if learned is None else learned

    def rebuild_s(self, context_tokens: int) -> float:
        """PrefillReload(r): what a device miss costs besides queueing."""
        if self.reload is not None:
            return self.reload.seconds(context_tokens)
        return self.prefill_s(context_tokens)

    def benefit_s(self, context_tokens: int) -> float:
        return self.queue_delay.mean * self.eta.eta + self.rebuild_s(context_tokens)

    def cold_mean_s(self) -> float:
        """The cold start's mean tool time: the mean of the samples seen so far, 1 s before any.
        The paper's Exp(1) in seconds is a choice of unit: on tools that take 0.2 s (or 20 s) it
        decides by a time scale the tools do not have."""
        g = self.stats.global_samples
        if len(g) == 0 or g.mean <= 0:
            return 1.0
        return g.mean

    def window_for(self, tool: str) -> tuple[Optional[SampleWindow], str]:
        """The CDF a decision for ``tool`` reads: (None, "cold") below K global samples."""
        if len(self.stats.global_samples) <= self.k:
            return None, "cold"
        return self.stats.window_for(tool, min_samples=self.k + 1)

    def decide(self, query: TTLQuery) -> Decision:
        # P(tau, f) = rho_f * F_f(tau) * survival: the pin pays only if the program comes back
        # (rho), before the deadline (F), and the pin was not shed meanwhile (survival)
        rho = self.stats.return_probability(query.tool) * self.pin_survival
        rebuild = self.rebuild_s(query.context_tokens)
        eta = self.eta.eta
        benefit = rho * (self.queue_delay.mean * eta + rebuild)
        cap = self.settings.max_ttl_s
        window, source = self.window_for(query.tool)
        if query.hint_s is not None:  # the client's forecast moves the learned durations (``forecast.py``)
            hinted = self.forecast.durations(query.tool, query.hint_s)
            ttl = argmax_sorted(hinted, benefit, cap_s=cap) if benefit > 0 else 0.0
            source, samples = "hint", hinted.size
        elif window is None:
            ttl = exp_optimum(benefit, self.cold_mean_s(), cap)
            samples = len(self.stats.global_samples)
        else:
            ttl = self._argmax(window, benefit, cap)
            samples = len(window)
        own = self.stats.tool(query.tool)
        return Decision(
            ttl,
            source,
            benefit,
            samples,
            rho,
            tool=query.tool,
            context_tokens=query.context_tokens,
            queue_delay_s=self.queue_delay.mean,
            queue_delay_samples=len(self.queue_delay),
            eta=eta,
            rebuild_s=rebuild,
            tool_samples=0 if own is None else len(own),
        )

    def host_ttl(self, query: TTLQuery, elapsed_s: float) -> float:
        if self.reload is None:
            return 0.0
        benefit = self.prefill_s(query.context_tokens) - self.reload.seconds(query.context_tokens)
        benefit *= self.stats.return_probability(query.tool)
        window, _ = self.window_for(query.tool)
        if query.hint_s is not None:
            samples = self.forecast.durations(query.tool, query.hint_s)
        else:
            samples = None if window is None else window.sorted
        return host_ttl(
            samples,
            elapsed_s,
            benefit,
            self.host_hold_cost,
            cap_s=self.max_host_ttl_s,
            cold_mean_s=self.cold_mean_s(),
        )

    def ttl(self, query: TTLQuery) -> float:
        d = self.last = self.decide(query)
        self.decisions.add(d)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "continuum: ttl decision tool=%s ttl=%.3fs branch=%s cdf_samples=%d tool_samples=%d "
                "T=%.3fs (%d misses) eta=%.3f reload=%.3fs (%d tokens) return_p=%.2f benefit=%.3fs",
                d.tool,
                d.ttl,
                d.source,
                d.samples,
                d.tool_samples,
                d.queue_delay_s,
                d.queue_delay_samples,
                d.eta,
                d.rebuild_s,
                d.context_tokens,
                d.return_p,
                d.benefit_s,
            )
        return d.ttl

    def signals(self) -> dict:
        out = super().signals()
        out["decisions"] = asdict(self.decisions)
        if self.last is not None:
            out["last_decision"] = asdict(self.last)
        return out

    def _argmax(self, window: SampleWindow, benefit: float, cap: float) -> float:
        if benefit <= 0:
            return 0.0
        s = window.sorted
        ranks = self._ranks.get(s.size)
        if ranks is None:
            if len(self._ranks) > 64:
                self._ranks.clear()
            ranks = self._ranks[s.size] = np.arange(1, s.size + 1, dtype=np.float64) / s.size
        return argmax_sorted(s, benefit, ranks, cap_s=cap)


def exp_optimum(benefit_s: float, mean_s: float, cap_s: float = math.inf) -> float:
    """``argmax over tau in [0, cap_s] of  (1 - e^(-tau/m)) * B - tau``, tool times ~ Exp(mean m):
    ``m * ln(B / m)`` when ``B > m``, else 0. The objective is concave, so the optimum within the
    cap is the capped optimum. ``m = 1`` is the paper's cold start."""
    if not mean_s > 0:
        raise ValueError("mean_s must be positive")
    return min(mean_s * math.log(benefit_s / mean_s), cap_s) if benefit_s > mean_s else 0.0


def cost_model(settings, stats: ToolStats) -> CostModelTTL:
    """The product's TTL model, with the measured prefill profile if one is configured."""
    profile = PrefillProfile.load(settings.prefill_profile) if settings.prefill_profile else None
    return CostModelTTL(settings, stats, profile)
