"""What the tests share: a controller with a chosen TTL model and time scales, and the rules
string a server is started with for the same."""

from __future__ import annotations

from functools import partial
from typing import Optional

from continuum_lab.bench.ttl_baselines import BernsteinTTL, FixedTTL, ReferenceTTL
from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.cost_model import CostModelTTL
from sglang_continuum.core.rules import Rules, Timings
from sglang_continuum.core.settings import ContinuumSettings

TIMING_FIELDS = set(Timings.__dataclass_fields__)


def rules(ttl_model: str = "fixed", *, fixed_ttl_s: float = 2.0, host_ttl_s: float = 60.0, **kw) -> Rules:
    """A ``Rules`` with the named TTL model; ``kw``: ``Timings`` fields, the cost model's
    ``cold_start_k``, the Bernstein model's parameters, ``order``."""
    timings = Timings(**{k: kw.pop(k) for k in list(kw) if k in TIMING_FIELDS})
    order = kw.pop("order", None)
    if ttl_model == "fixed":
        factory = partial(FixedTTL, ttl_s=fixed_ttl_s, host_ttl_s=host_ttl_s, **kw)
    elif ttl_model == "reference":
        factory = partial(ReferenceTTL, host_ttl_s=host_ttl_s, **kw)
    elif ttl_model == "bernstein":
        factory = partial(BernsteinTTL, host_ttl_s=host_ttl_s, **kw)
    elif ttl_model == "cost":
        factory = partial(CostModelTTL, **kw)
    else:
        raise ValueError(ttl_model)
    extra = {"order": order} if order is not None else {}
    return Rules(f"test-{ttl_model}", ttl_model=factory, timings=timings, **extra)


def controller(
    ttl_model: str = "fixed", *, budget: int = 10_000, clock: Optional[ManualClock] = None, **kw
) -> tuple[ContinuumController, ManualClock]:
    """A controller on a manual clock; ``kw``: settings fields, or what ``rules`` takes."""
    fields = set(ContinuumSettings.model_fields)
    settings = ContinuumSettings(**{k: kw.pop(k) for k in list(kw) if k in fields})
    clock = clock or ManualClock()
    return ContinuumController(settings, clock=clock, budget_tokens=budget, rules=rules(ttl_model, **kw)), clock


def variant_rules(name: str, **kwargs) -> str:
    """The ``rules`` setting naming the lab variant factory ``name`` called with ``kwargs``."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"continuum_lab.bench.variants:{name}({args})"


def fixed_ttl_rules(seconds: float, **timings: float) -> str:
    """The ``rules`` setting of a server that pins every turn for ``seconds``."""
    return variant_rules("fixed_ttl", seconds=seconds, **timings)


def fixed_ttl_env(seconds: float, **timings: float) -> dict[str, str]:
    """A server's environment for the same (``max_ttl_s`` raised to ``seconds`` if needed)."""
    env = {"SGLANG_CONTINUUM_RULES": fixed_ttl_rules(seconds, **timings)}
    if seconds > ContinuumSettings().max_ttl_s:
        env["SGLANG_CONTINUUM_MAX_TTL_S"] = repr(float(seconds))
    return env
