"""A policy composition (``Rules``): one slot per decision -- the waiting queue's order, the TTL
model, residency, the door, the wait bound, which pin to shed, the critical paths' reserve, the
applications' queue ranks -- and the policy's time scales, selected by name.

The product is one composition, ``DEFAULT``: program-level FCFS (``priority.program_fcfs``), the
paper's cost model (``cost_model.cost_model``), residency with its hold bound
(``residency.Residency``), the door with its working set (``door.Door``),
bounded waiting (``bounded_waiting.BoundedWaiting``), stale-then-latest shedding
(``shedding.Shedding``), the critical paths' reserve (``critical.CriticalShare``), application-level
FCFS (``applications.ApplicationRanks``) and the time scales below. Each slot is a factory the
controller calls once, so an experiment on any decision is a variant, never an edit of the
controller. Research variants -- the paper's ablations, a probe's short lifetimes -- are other
compositions, defined in the lab (``continuum_lab.bench.variants``), never switches in the product.
A server takes one by the ``rules`` setting, ``"package.module:NAME"`` (a ``Rules``, or a function
returning one, called with the literal keyword arguments written after it:
``"pkg.mod:fixed_ttl(seconds=5)"``), resolved here at start-up as vLLM resolves ``scheduler_cls``;
a name that does not resolve stops start-up.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from sglang_continuum.core.applications import ApplicationRanks
from sglang_continuum.core.bounded_waiting import BoundedWaiting
from sglang_continuum.core.cost_model import cost_model
from sglang_continuum.core.critical import CriticalShare
from sglang_continuum.core.door import Door
from sglang_continuum.core.priority import OrderKey, program_fcfs
from sglang_continuum.core.programs import PROGRAM_IDLE_TIMEOUT_S
from sglang_continuum.core.residency import Residency
from sglang_continuum.core.shedding import Shedding

if TYPE_CHECKING:
    from sglang_continuum.core.door import WorkingSet
    from sglang_continuum.core.pins import PinTable
    from sglang_continuum.core.programs import ProgramRegistry
    from sglang_continuum.core.silence import Silence
    from sglang_continuum.core.tool_stats import ToolStats
    from sglang_continuum.core.ttl import TTLModel, TTLSettings

TTLFactory = Callable[["TTLSettings", "ToolStats"], "TTLModel"]
# (admission_control setting, tool statistics, the TTL model's rebuild seconds per context, and the
# max_ttl_s and max_hold_s settings as keywords) -> residency
ResidencyFactory = Callable[..., Residency]
DoorFactory = Callable[[bool, Residency], Door]  # (admission_control setting, residency) -> the door
WaitBoundFactory = Callable[[int], BoundedWaiting]  # (max_overtakes setting) -> the wait bound
SheddingFactory = Callable[["PinTable", "ProgramRegistry", "Silence"], Shedding]
CriticalFactory = Callable[["ProgramRegistry", "WorkingSet"], CriticalShare]  # the critical paths' reserve
ApplicationsFactory = Callable[..., ApplicationRanks]  # (idle_s=program_idle_timeout_s) -> applications' ranks


@dataclass(frozen=True)
class Timings:
    """The policy's time scales, in seconds."""

    program_idle_timeout_s: float = PROGRAM_IDLE_TIMEOUT_S  # a program unseen this long is forgotten
    max_wait_hold_s: float = 10.0  # a pin past its TTL is kept this much longer while its next turn waits
    max_host_ttl_s: float = 300.0  # longest a host copy is protected after its device pin ended
    stats_save_interval_s: float = 30.0  # how often a serving scheduler hands its statistics to the saver

    def check(self, max_ttl_s: float) -> None:
        """Nothing a program holds may outlive the program."""
        if self.program_idle_timeout_s <= max_ttl_s + self.max_wait_hold_s + self.max_host_ttl_s:
            raise ValueError(
                f"program_idle_timeout_s ({self.program_idle_timeout_s:g}) must exceed max_ttl_s ({max_ttl_s:g}) "
                f"+ max_wait_hold_s ({self.max_wait_hold_s:g}) + max_host_ttl_s ({self.max_host_ttl_s:g})"
            )
        if min(self.max_wait_hold_s, self.max_host_ttl_s) < 0 or self.stats_save_interval_s <= 0:
            raise ValueError("timings must be >= 0 (the save interval > 0)")


@dataclass(frozen=True)
class Rules:
    name: str
    order: OrderKey = program_fcfs
    ttl_model: TTLFactory = cost_model
    residency: ResidencyFactory = Residency
    door: DoorFactory = Door
    wait_bound: WaitBoundFactory = BoundedWaiting
    shedding: SheddingFactory = Shedding
    critical: CriticalFactory = CriticalShare
    applications: ApplicationsFactory = ApplicationRanks
    timings: Timings = field(default_factory=Timings)


DEFAULT = Rules("continuum")
_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)(?:\((?P<args>.*)\))?$", re.S)


def resolve_rules(spec: str) -> Rules:
    """``"default"``, ``"package.module:NAME"`` naming a ``Rules`` or a function returning one, or
    ``"package.module:NAME(key=literal, ...)"`` calling that function with those arguments."""
    if spec in ("", "default"):
        return DEFAULT
    match = _SPEC.match(spec.strip())
    if match is None:
        raise ValueError(f"rules {spec!r}: expected 'default' or 'package.module:NAME[(key=value, ...)]'")
    try:
        found = getattr(importlib.import_module(match["module"]), match["attr"])
        kwargs = _literal_kwargs(match["args"]) if match["args"] is not None else None
        if kwargs is not None or (callable(found) and not isinstance(found, Rules)):
            found = found(**(kwargs or {}))
    except (ImportError, AttributeError, TypeError, ValueError, SyntaxError) as exc:
        raise ValueError(f"rules {spec!r} does not resolve: {exc}") from exc
    if not isinstance(found, Rules):
        raise ValueError(f"rules {spec!r} is a {type(found).__name__}, not a Rules")
    return found


def _literal_kwargs(text: str) -> dict:
    call = ast.parse(f"f({text})", mode="eval").body
    if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
        raise ValueError("arguments must be key=value")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}
