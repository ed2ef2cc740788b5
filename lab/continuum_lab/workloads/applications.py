"""Multi-agent applications: JSONL, one application per line (Tokencake's Code-Writer and Deep
Research, ``workloads/multi_agent.py``).

    {"app_id": "cw-0-0003", "kind": "code-writer", "agents": [
        {"agent_id": "planner", "agent_type": "planner", "depends_on": [], "turns": [Turn, ...]},
        {"agent_id": "programmer-0", "agent_type": "programmer", "depends_on": ["planner"], "turns": [...]},
        ...]}

Each agent is a multi-turn program with tools, its turns ``schema.Turn``s (the last calls no
tool); it starts once every agent it ``depends_on`` has ended, an agent with no dependencies when
its application arrives. The dependencies form a DAG. An agent runs as the program
``f"{app_id}/{agent_id}"`` (``program_id``), with tokens of its own: what a dependency produced is
not sent again token for token (its result reaches the dependent as that agent's own prompt).

The critical path is the DAG's longest path by each agent's expected duration: its tokens priced at
a simple rate (``Rates``) plus its tool times. An agent on it delays the whole application by any
delay of its own (``critical_agents``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from continuum_lab.workloads.schema import Program, Turn, WorkloadError, dump_jsonl, jsonl_records


class Agent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: str = Field(min_length=1, pattern=r"^[^/]+$")  # "/" joins it to its app's id
    agent_type: str = Field(min_length=1)  # abnormal agents are judged against their type's mean
    depends_on: list[str] = Field(default_factory=list)
    turns: list[Turn] = Field(min_length=1)

    @model_validator(mode="after")
    def _last_turn_calls_no_tool(self) -> "Agent":
        last = self.turns[-1]
        if last.tool is not None or last.tool_duration_s != 0.0:
            raise ValueError("the last turn calls no tool: its tool must be null and its tool_duration_s 0")
        if len(set(self.depends_on)) != len(self.depends_on):
            raise ValueError(f"agent {self.agent_id!r} names a dependency twice")
        return self

    @property
    def tool_s(self) -> float:
        return sum(t.tool_duration_s for t in self.turns)


class Application(BaseModel):
    model_config = ConfigDict(extra="forbid")

    app_id: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    agents: list[Agent] = Field(min_length=1)

    @model_validator(mode="after")
    def _a_dag(self) -> "Application":
        ids = [a.agent_id for a in self.agents]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate agent_id in {sorted({i for i in ids if ids.count(i) > 1})}")
        for agent in self.agents:
            missing = [d for d in agent.depends_on if d not in ids]
            if missing:
                raise ValueError(f"agent {agent.agent_id!r} depends on unknown agents {missing}")
        topological_order(self)  # raises on a cycle
        return self

    def program_id(self, agent: Agent) -> str:
        return f"{self.app_id}/{agent.agent_id}"

    def program(self, agent: Agent) -> Program:
        return Program(program_id=self.program_id(agent), turns=agent.turns)


def topological_order(app: Application) -> list[Agent]:
    """Agents with every dependency before them, ties in file order (Kahn's algorithm); a cycle
    raises ``ValueError`` naming the agents on it or behind it."""
    waiting = {a.agent_id: set(a.depends_on) for a in app.agents}
    order: list[Agent] = []
    while len(order) < len(app.agents):
        ready = [a for a in app.agents if a.agent_id in waiting and not waiting[a.agent_id]]
        if not ready:
            raise ValueError(f"the dependencies form a cycle through {sorted(waiting)}")
        for agent in ready:
            order.append(agent)
            del waiting[agent.agent_id]
        for deps in waiting.values():
            deps.difference_update(a.agent_id for a in ready)
    return order


@dataclass(frozen=True)
class Rates:
    """A simple price for an agent's tokens, what a request gets on a loaded H100 serving an 8B
    model (the ranking it gives the agents matters, not the seconds): appended tokens prefill at
    ``prefill_tokens_per_s``, outputs decode at ``output_tokens_per_s``."""

    prefill_tokens_per_s: float = 8000.0
    output_tokens_per_s: float = 60.0


def expected_duration_s(agent: Agent, rates: Rates = Rates()) -> float:
    appended = sum(t.append_tokens for t in agent.turns)
    output = sum(t.output_tokens for t in agent.turns)
    return appended / rates.prefill_tokens_per_s + output / rates.output_tokens_per_s + agent.tool_s


def longest_path(app: Application, weight: Callable[[Agent], float], eps: float = 1e-9) -> tuple[float, set[str]]:
    """(the longest path's length through the DAG, the agents on a longest path): an agent is on
    one when its earliest finish equals its latest finish (every tie counts)."""
    order = topological_order(app)
    w = {a.agent_id: weight(a) for a in order}
    finish: dict[str, float] = {}
    for a in order:
        finish[a.agent_id] = w[a.agent_id] + max((finish[d] for d in a.depends_on), default=0.0)
    length = max(finish.values())
    latest = {a.agent_id: length for a in order}
    for a in reversed(order):
        for d in a.depends_on:
            latest[d] = min(latest[d], latest[a.agent_id] - w[a.agent_id])
    scale = max(1.0, length)
    return length, {a for a in finish if latest[a] - finish[a] <= eps * scale}


def critical_agents(app: Application, rates: Rates = Rates()) -> set[str]:
    """The agents on the application's critical path (by ``expected_duration_s``)."""
    return longest_path(app, lambda a: expected_duration_s(a, rates))[1]


def tool_bound_s(app: Application) -> float:
    """The most tool time on any path of the DAG: no schedule ends the application sooner."""
    return longest_path(app, lambda a: a.tool_s)[0]


def agent_programs(apps: Iterable[Application]) -> list[Program]:
    """Every agent as the program it runs, application by application."""
    return [app.program(a) for app in apps for a in topological_order(app)]


def parse_applications(lines: Iterable[str | bytes], source: str = "<applications>") -> list[Application]:
    apps: list[Application] = []
    seen: set[str] = set()
    for lineno, app in jsonl_records(lines, source, Application):
        if app.app_id in seen:
            raise WorkloadError(f"{source}:{lineno}: duplicate app_id {app.app_id!r}")
        seen.add(app.app_id)
        apps.append(app)
    if not apps:
        raise WorkloadError(f"{source}: no applications")
    return apps


def load_applications(path: str | Path) -> list[Application]:
    path = Path(path)
    with path.open("rb") as f:
        return parse_applications(f, str(path))


def dump_applications(apps: Iterable[Application], path: str | Path) -> Path:
    return dump_jsonl(apps, path)


def agent_types(apps: Iterable[Application]) -> dict[str, str]:
    """program id -> its agent's type."""
    return {app.program_id(a): a.agent_type for app in apps for a in app.agents}
