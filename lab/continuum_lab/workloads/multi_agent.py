"""Seeded generators for multi-agent applications shaped like Tokencake's two benchmarks (section 7.1).

* ``code-writer``: many specialised agents and frequent short file-I/O tools (0.1-2 s): a planner,
  then 3-6 programmers in parallel, a reviewer once every programmer has ended, a tester after it.
* ``deep-research``: fewer agents, more intricate dependencies and long search tools (seconds): a
  planner, 3-5 searchers in parallel, 2-3 analysts each reading a subset of the searchers, a
  summarizer over every analyst (and at times one searcher directly), a writer over the summarizer
  and the planner.

Token counts are drawn at an 8B model's scale on a GPU (an agent's first prompt 1-4k tokens, tool
outputs hundreds to thousands); ``token_scale`` shrinks them (a CPU server needs contexts of a few
hundred tokens) and ``tool_scale`` every tool time. Tool times are log-uniform in each tool's range.

    python -m continuum_lab.workloads.multi_agent code-writer --apps 24 --seed 0 --out W.jsonl
    python -m continuum_lab.workloads.multi_agent standard --out workloads/multi-agent
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from continuum_lab.workloads.applications import (
    Agent,
    Application,
    critical_agents,
    dump_applications,
    tool_bound_s,
)
from continuum_lab.workloads.schema import Turn

TOKEN_SPREAD = 0.35  # lognormal sigma of every token draw around its role's mean


@dataclass(frozen=True)
class Role:
    agent_type: str
    turns: tuple[int, int]  # fewest and most turns, inclusive
    prompt_tokens: float  # first turn: system prompt, task and what its dependencies handed over
    tool_output_tokens: float  # appended after each tool call
    output_tokens: float  # generated per turn that calls a tool
    last_output_tokens: float  # its final answer
    tools: tuple[tuple[str, float, float], ...]  # (tool, shortest s, longest s)


FILE_IO = (("read_file", 0.1, 0.6), ("write_file", 0.1, 0.5), ("list_dir", 0.1, 0.3), ("grep", 0.1, 0.4))
CODE_WRITER = {
    "planner": Role("planner", (2, 3), 1800, 400, 250, 600, FILE_IO[:1] + FILE_IO[2:3]),
    "programmer": Role("programmer", (4, 7), 2200, 600, 300, 400, (*FILE_IO, ("run_lint", 0.5, 2.0))),
    "reviewer": Role("reviewer", (3, 5), 3000, 500, 250, 400, (FILE_IO[0], ("diff", 0.1, 0.5))),
    "tester": Role("tester", (3, 5), 2000, 700, 200, 300, (FILE_IO[1], ("run_tests", 0.8, 2.0))),
}
SEARCH = (("web_search", 2.0, 8.0), ("fetch_page", 1.0, 5.0))
DEEP_RESEARCH = {
    "planner": Role("planner", (2, 2), 1500, 300, 300, 600, SEARCH[:1]),
    "searcher": Role("searcher", (3, 5), 1200, 2000, 120, 500, SEARCH),
    "analyst": Role("analyst", (2, 4), 3000, 800, 300, 700, (("python", 0.5, 3.0), SEARCH[1])),
    "summarizer": Role("summarizer", (2, 3), 4000, 500, 300, 900, (("read_notes", 0.1, 0.5),)),
    "writer": Role("writer", (2, 3), 3000, 300, 500, 1500, (("cite_check", 0.5, 2.0),)),
}


@dataclass(frozen=True)
class Scale:
    token_scale: float = 1.0
    tool_scale: float = 1.0
    output_scale: float | None = None  # default: token_scale

    @property
    def outputs(self) -> float:
        return self.token_scale if self.output_scale is None else self.output_scale


def _tokens(rng: np.random.Generator, mean: float, scale: float) -> int:
    drawn = rng.lognormal(math.log(mean) - TOKEN_SPREAD**2 / 2, TOKEN_SPREAD)
    return max(1, int(round(drawn * scale)))


def draw_agent(rng: np.random.Generator, role: Role, agent_id: str, depends_on: list[str], scale: Scale) -> Agent:
    n = int(rng.integers(role.turns[0], role.turns[1] + 1))
    turns = []
    for i in range(n):
        last = i == n - 1
        append = role.prompt_tokens if i == 0 else role.tool_output_tokens
        output = role.last_output_tokens if last else role.output_tokens
        tool, low, high = role.tools[int(rng.integers(len(role.tools)))]
        seconds = math.exp(rng.uniform(math.log(low), math.log(high)))  # drawn on every turn: stable streams
        turns.append(
            Turn(
                append_tokens=_tokens(rng, append, scale.token_scale),
                output_tokens=_tokens(rng, output, scale.outputs),
                tool=None if last else tool,
                tool_duration_s=0.0 if last else round(seconds * scale.tool_scale, 4),
            )
        )
    return Agent(agent_id=agent_id, agent_type=role.agent_type, depends_on=depends_on, turns=turns)


def code_writer_app(rng: np.random.Generator, app_id: str, scale: Scale) -> Application:
    roles = CODE_WRITER
    programmers = [f"programmer-{k}" for k in range(int(rng.integers(3, 7)))]
    agents = [draw_agent(rng, roles["planner"], "planner", [], scale)]
    agents += [draw_agent(rng, roles["programmer"], p, ["planner"], scale) for p in programmers]
    agents.append(draw_agent(rng, roles["reviewer"], "reviewer", programmers, scale))
    agents.append(draw_agent(rng, roles["tester"], "tester", ["reviewer"], scale))
    return Application(app_id=app_id, kind="code-writer", agents=agents)


def deep_research_app(rng: np.random.Generator, app_id: str, scale: Scale) -> Application:
    roles = DEEP_RESEARCH
    searchers = [f"searcher-{k}" for k in range(int(rng.integers(3, 6)))]
    analysts = [f"analyst-{k}" for k in range(int(rng.integers(2, 4)))]
    reads: dict[str, set[str]] = {}
    for a in analysts:  # each analyst reads 1-3 searchers' findings
        k = int(rng.integers(1, min(3, len(searchers)) + 1))
        reads[a] = set(rng.choice(searchers, size=k, replace=False).tolist())
    for s in searchers:  # and every searcher's findings reach some analyst
        if not any(s in r for r in reads.values()):
            reads[analysts[int(rng.integers(len(analysts)))]].add(s)
    summarizer_deps = list(analysts)
    if rng.random() < 0.5:  # a searcher whose raw findings the summarizer also reads
        summarizer_deps.append(searchers[int(rng.integers(len(searchers)))])
    agents = [draw_agent(rng, roles["planner"], "planner", [], scale)]
    agents += [draw_agent(rng, roles["searcher"], s, ["planner"], scale) for s in searchers]
    agents += [draw_agent(rng, roles["analyst"], a, sorted(reads[a], key=searchers.index), scale) for a in analysts]
    agents.append(draw_agent(rng, roles["summarizer"], "summarizer", summarizer_deps, scale))
    agents.append(draw_agent(rng, roles["writer"], "writer", ["summarizer", "planner"], scale))
    return Application(app_id=app_id, kind="deep-research", agents=agents)


KINDS = {"code-writer": ("cw", code_writer_app), "deep-research": ("dr", deep_research_app)}


def generate_applications(kind: str, apps: int, *, seed: int = 0, **scale) -> list[Application]:
    """``apps`` applications of ``kind``; ``scale``: ``Scale``'s fields."""
    prefix, draw = KINDS[kind]
    rng = np.random.default_rng(seed)
    return [draw(rng, f"{prefix}-s{seed}-{i:03d}", Scale(**scale)) for i in range(apps)]


def summary(apps: list[Application]) -> dict:
    agents = [a for app in apps for a in app.agents]
    tools = [t.tool_duration_s for a in agents for t in a.turns[:-1]]
    contexts = [sum(t.append_tokens + t.output_tokens for t in a.turns) for a in agents]
    return {
        "applications": len(apps),
        "agents_per_app": len(agents) / len(apps),
        "turns_per_agent": float(np.mean([len(a.turns) for a in agents])),
        "agent_context_tokens_mean": float(np.mean(contexts)),
        "tool_s_mean": float(np.mean(tools)) if tools else 0.0,
        "critical_agents_per_app": float(np.mean([len(critical_agents(app)) for app in apps])),
        "tool_bound_s_mean": float(np.mean([tool_bound_s(app) for app in apps])),
    }


# the committed files: (file, kind, applications, token scale); the GPU-sized ones for --emulate
# on the H100 profiles, the CPU-sized ones for a tiny model on a CPU server
STANDARD = (
    ("code-writer.jsonl", "code-writer", 24, 1.0),
    ("deep-research.jsonl", "deep-research", 24, 1.0),
    ("code-writer-cpu.jsonl", "code-writer", 8, 0.05),
    ("deep-research-cpu.jsonl", "deep-research", 8, 0.05),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Generate seeded multi-agent applications (JSONL).")
    ap.add_argument("kind", choices=[*KINDS, "standard"], help="standard: the committed files into --out DIR")
    ap.add_argument("--apps", type=int, default=24, help="applications to draw")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-scale", type=float, default=1.0, help="scale every token count (CPU: ~0.05)")
    ap.add_argument("--output-scale", type=float, default=None, help="output token scale (default: --token-scale)")
    ap.add_argument("--tool-scale", type=float, default=1.0, help="scale every tool time")
    ap.add_argument("--out", type=Path, required=True, help="the JSONL (standard: the folder)")
    args = ap.parse_args(argv)
    if args.kind == "standard":
        jobs = [(args.out / name, kind, n, scale) for name, kind, n, scale in STANDARD]
    else:
        jobs = [(args.out, args.kind, args.apps, args.token_scale)]
    for path, kind, n, token_scale in jobs:
        apps = generate_applications(
            kind, n, seed=args.seed, token_scale=token_scale, tool_scale=args.tool_scale, output_scale=args.output_scale
        )
        dump_applications(apps, path)
        print(f"wrote {path}: {summary(apps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
