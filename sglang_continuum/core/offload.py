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
from typing import Callable, Optional, Protocol

import numpy as np

from sglang_continuum.core.ttl import argmax_sorted

# Conservative host-to-device bandwidth when nothing was measured: a quarter of PCIe 4.0 x16's
# practical ~25 GB/s (scattered page copies, shared links). ``continuum-profile --host-bandwidth``
# measures the real figure.
DEFAULT_HOST_BYTES_PER_S = 6e9
DEFAULT_RELOAD_LATENCY_S = 1e-3
HOST_PIN_BUDGET_FRACTION = 0.5  # share of the host pool host pins may hold


class Reload(Protocol):
    def seconds(self, tokens: int) -> float: ...


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


class LearnedReload:
    """The reload cost the engine's own steps show (``EngineTime``: what a prefill step pays per
    token it loaded from host), ``guess``'s until enough loads were seen. Used where no bandwidth
    was measured: the transfer a load adds to a step, not the link's bandwidth, is the price, and
    a copy the forward hides behind its compute costs nothing."""

    def __init__(self, guess: ReloadCost, seconds_per_token: Callable[[], Optional[float]]) -> None:
        self.guess = guess
        self._seconds_per_token = seconds_per_token

    def seconds(self, tokens: int) -> float:
        per_token = self._seconds_per_token()
        if per_token is None:
            return self.guess.seconds(tokens)
        return self.guess.latency_s + max(0, tokens) * per_token


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


def lends_gap(remaining_s: Optional[float], pin_tokens: int, request_prefill_s: float, reload: Reload) -> bool:
    """Tokencake's Algorithm 1: whether a pinned program out on a tool call for another
    ``remaining_s`` (the forecast's median; None: unknown) should give its device memory to a
    waiting turn that prefills in ``request_prefill_s``: the call must outlast the pin's trip to host
    and back (``2 * Reload(r)``) by at least that prefill, else there is no window to serve it in."""
    if remaining_s is None:
        return False
    window = remaining_s - 2.0 * reload.seconds(pin_tokens)
    return window > 0 and request_prefill_s <= window
