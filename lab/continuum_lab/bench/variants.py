"""The paper's ablations as rule compositions (``sglang_continuum.core.rules.Rules``).

A server runs one by name: ``SGLANG_CONTINUUM_RULES=continuum_lab.bench.variants:PINS_ONLY``
(``bench/policies.py`` does this for each named policy), or a parameterised one:
``continuum_lab.bench.variants:fixed_ttl(seconds=5, program_idle_timeout_s=20)`` (tests and the
reliability probes: a fixed TTL and short lifetimes make "back to empty" reachable in seconds).
Each is the product's default with one rule swapped; none is the default itself.
"""

from __future__ import annotations

from functools import partial

from continuum_lab.bench.ttl_baselines import BernsteinTTL, FixedTTL, ReferenceTTL
from sglang_continuum.core.priority import RETRACTED, WAITING, QueueKey, Waiting
from sglang_continuum.core.rules import Rules, Timings


def request_fcfs(w: Waiting) -> QueueKey:
    """SGLang's fcfs (retracted requests first, then arrival): pins without program-level order."""
    return (RETRACTED if w.retracted else WAITING, w.request_rank, 0)


def fixed_ttl(seconds: float, **timings: float) -> Rules:
    """Every non-final turn pinned for ``seconds`` (the paper's static-TTL rung); ``timings``:
    ``core.rules.Timings`` fields other than the default's."""
    return Rules(f"fixed-{seconds:g}s", ttl_model=partial(FixedTTL, ttl_s=seconds), timings=Timings(**timings))


def timed(**timings: float) -> Rules:
    """The product's rules on other time scales (``core.rules.Timings`` fields): tests and probes
    that must see a save, an expiry or a forgotten program within seconds."""
    return Rules("continuum-timed", timings=Timings(**timings))


PINS_ONLY = Rules("pins-only", order=request_fcfs)
FIXED_2S = fixed_ttl(2.0)
REFERENCE = Rules("reference", ttl_model=ReferenceTTL)  # the public vLLM reference's 2 s rule
BERNSTEIN = Rules("bernstein", ttl_model=BernsteinTTL)  # the paper's first version
