"""What the tests share: a controller with a chosen TTL model and time scales, and the rules
string a server is started with for the same.

The product's tests use the product: this module imports no lab code. Two small doubles stand in
for the lab's ablation rules where a test needs a decision held still: ``FixedTTL`` (a constant
TTL, standing in for ``continuum_lab.bench.ttl_baselines.FixedTTL``) and ``request_fcfs`` (SGLang's
request-level fcfs order, standing in for ``continuum_lab.bench.variants.request_fcfs``). The
rules strings below only name the lab's variants: a server started with one imports them.
"""

from __future__ import annotations

import random
import socket
from functools import partial
from typing import Callable, Optional, Union

from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.cost_model import CostModelTTL
from sglang_continuum.core.priority import RETRACTED, WAITING, QueueKey, Waiting
from sglang_continuum.core.rules import Rules, Timings
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.ttl import TTLModel, TTLQuery

TIMING_FIELDS = set(Timings.__dataclass_fields__)
Model = Union[str, Callable[..., TTLModel]]  # a name ``rules`` knows, or a factory (settings, stats, **kw)


class FixedTTL(TTLModel):
    """Every non-final turn pinned for ``ttl_s`` (the controller caps it at ``max_ttl_s``); with a
    host tier a host copy is protected for ``host_ttl_s``, at most the tier's longest."""

    name = "fixed"

    def __init__(
        self, settings, stats, *, ttl_s: float = 2.0, host_ttl_s: float = 60.0, rebuild_s: float = 0.0
    ) -> None:
        super().__init__(settings, stats)
        self.ttl_s, self.host_ttl_s, self.rebuild_seconds = ttl_s, host_ttl_s, rebuild_s

    def ttl(self, query: TTLQuery) -> float:
        return self.ttl_s

    def prefill_s(self, context_tokens: int) -> float:
        return self.rebuild_seconds

    def rebuild_s(self, context_tokens: int) -> float:
        return self.rebuild_seconds

    def host_ttl(self, query: TTLQuery, elapsed_s: float) -> float:
        return min(self.host_ttl_s, self.max_host_ttl_s)


def request_fcfs(w: Waiting) -> QueueKey:
    """SGLang's fcfs (retracted requests first, then arrival): pins without program-level order."""
    return (RETRACTED if w.retracted else WAITING, w.request_rank, 0)


def rules(
    ttl_model: Model = "fixed", *, fixed_ttl_s: float = 2.0, host_ttl_s: float = 60.0, rebuild_s: float = 0.0, **kw
) -> Rules:
    """A ``Rules`` with the named TTL model ("fixed": ``FixedTTL``; "cost": the product's), or
    with a factory of one; ``kw``: ``Timings`` fields, ``order``, the model's parameters (the cost
    model's ``cold_start_k``, a factory's keyword arguments), ``door`` (a ``Door`` class)."""
    timings = Timings(**{k: kw.pop(k) for k in list(kw) if k in TIMING_FIELDS})
    # the ``Rules`` slots passed on; None: the default's
    slots = {name: given for name in ("order", "residency", "door") if (given := kw.pop(name, None)) is not None}
    if callable(ttl_model):
        factory, name = partial(ttl_model, **kw), getattr(ttl_model, "name", "model")
    elif ttl_model == "fixed":
        factory, name = (
            partial(FixedTTL, ttl_s=fixed_ttl_s, host_ttl_s=host_ttl_s, rebuild_s=rebuild_s, **kw),
            ttl_model,
        )
    elif ttl_model == "cost":
        factory, name = partial(CostModelTTL, **kw), ttl_model
    else:
        raise ValueError(ttl_model)
    return Rules(f"test-{name}", ttl_model=factory, timings=timings, **slots)


def controller(
    ttl_model: Model = "fixed", *, budget: int = 10_000, ceiling: int = 0, clock: Optional[ManualClock] = None, **kw
) -> tuple[ContinuumController, ManualClock]:
    """A controller on a manual clock (``budget``, ``ceiling``: its pins'); ``kw``: settings
    fields, or what ``rules`` takes."""
    fields = set(ContinuumSettings.model_fields)
    settings = ContinuumSettings(**{k: kw.pop(k) for k in list(kw) if k in fields})
    clock = clock or ManualClock()
    made = ContinuumController(
        settings, clock=clock, budget_tokens=budget, pin_ceiling_tokens=ceiling, rules=rules(ttl_model, **kw)
    )
    return made, clock


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


def free_port() -> int:
    """A TCP port on localhost nobody listens on now, below the kernel's ephemeral range: a socket
    that keeps reconnecting to an ephemeral port nobody listens on yet can be given that very port
    as its own source port (a TCP self-connect), and then the port cannot be bound."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, ephemeral_low - 12_000), ephemeral_low)
        if port_is_free(port):
            return port
    raise RuntimeError("no free port below the ephemeral range")


def port_is_free(port: int) -> bool:
    """Nobody listens on ``port`` on localhost (a socket in TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
