"""Multi-agent applications on the replay client and the emulator (``continuum-bench --applications``).

Applications arrive as the same seeded Poisson process programs do (``replay.arrival_times`` at
``aps`` applications per second). On arrival an application's agents with no dependencies start;
any other agent starts the moment the last of its dependencies ends (``AgentStarts``). Each agent is
a multi-turn program (``f"{app_id}/{agent_id}"``) that the existing per-program loops send as they
send any program's turns: ``Replayer._program`` here, ``ClosedLoopDriver._start`` in the emulator
(``emulator/driver.py``). An agent that fails leaves its dependents unstarted and its application
unfinished. With hints every turn's ``custom_params`` also carries ``app_id``, whether the agent is on
its application's critical path, and the tool time its output calls (``replay.hinted``).

The figures (``application_figures``): application latency (arrival to its last agent's end),
abnormal agents (Tokencake's: an execution time, an agent's start to its end, over 1.5x the mean of
its agent_type in the run), the KV pool's use over time, beside the program figures ``summarize``
gives (throughput, per-turn waits, cache hits).
"""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

import numpy as np

from continuum_lab.bench.replay import ProgramRecord, Replayer, ReplayResult, arrival_times
from continuum_lab.workloads.applications import Application, critical_agents, topological_order
from continuum_lab.workloads.schema import Program

ABNORMAL_FACTOR = 1.5  # Tokencake's threshold: over 1.5x its type's mean execution time
SERIES_POINTS = 60  # a report's KV series: at most this many points (a run's JSON keeps every sample)


class AgentStarts:
    """Which agents start when. ``roots()``: (arrival, program) of every agent with no
    dependencies; ``ended(program_id)``: the agents that start now, their last dependency just
    ended. ``hints``: program id -> its ``app_id`` and ``critical`` flag."""

    def __init__(self, apps: Sequence[Application], aps: float, seed: int) -> None:
        self.arrivals = arrival_times(len(apps), aps, seed)
        self.programs: dict[str, Program] = {}
        self.app_of: dict[str, str] = {}
        self._waiting: dict[str, set[str]] = {}
        self._dependents: dict[str, list[str]] = {}
        self._roots: list[tuple[float, Program]] = []
        self.hints: dict[str, dict] = {}
        for app, at in zip(apps, self.arrivals):
            critical = critical_agents(app)
            for agent in topological_order(app):
                pid = app.program_id(agent)
                self.programs[pid] = app.program(agent)
                self.app_of[pid] = app.app_id
                self.hints[pid] = {"app_id": app.app_id, "critical": agent.agent_id in critical}
                deps = {f"{app.app_id}/{d}" for d in agent.depends_on}
                self._waiting[pid] = deps
                for d in deps:
                    self._dependents.setdefault(d, []).append(pid)
                if not deps:
                    self._roots.append((at, self.programs[pid]))

    def roots(self) -> list[tuple[float, Program]]:
        return list(self._roots)

    def ended(self, program_id: str) -> list[Program]:
        ready = []
        for pid in self._dependents.get(program_id, ()):
            waiting = self._waiting[pid]
            waiting.discard(program_id)
            if not waiting:
                ready.append(self.programs[pid])
        return ready


async def replay_applications(
    replayer: Replayer, apps: Sequence[Application], aps: float, *, hints: bool
) -> ReplayResult:
    """Every application through ``replayer`` (``Replayer._program`` per agent); returns when
    every started agent has ended."""
    starts = AgentStarts(apps, aps, replayer.seed)
    if hints:
        replayer.hints = starts.hints
    records: list[ProgramRecord] = []

    async def drive(client) -> None:
        tasks: list[asyncio.Task] = []

        async def agent(program: Program, at: float) -> None:
            rec = ProgramRecord(program.program_id, at)
            records.append(rec)
            await replayer._program(client, program, rec)  # waits for ``at``, then its turns
            if rec.ok:
                for ready in starts.ended(program.program_id):
                    tasks.append(asyncio.create_task(agent(ready, replayer._now())))

        tasks += [asyncio.create_task(agent(p, at)) for at, p in starts.roots()]
        i = 0
        while i < len(tasks):  # an agent adds its dependents before it ends
            await tasks[i]
            i += 1

    return await replayer._measured(len(starts.programs), drive, records)


def kv_series(samples: Sequence[Sequence[float]], points: int = SERIES_POINTS) -> list[list[float]]:
    """At most ``points`` of ``[t, used, occupied]`` samples, evenly spaced over the run."""
    if len(samples) <= points:
        return [list(s) for s in samples]
    idx = np.linspace(0, len(samples) - 1, points).round().astype(int)
    return [list(samples[i]) for i in idx]


def _pct(values: list[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q)) if values else None


def _mean(values) -> Optional[float]:
    values = list(values)
    return float(np.mean(values)) if values else None


def abnormal_agents(records: dict[str, ProgramRecord], types: dict[str, str]) -> dict:
    """Agents whose execution time (start to end) exceeds ``ABNORMAL_FACTOR`` x their type's mean
    in this run; finished agents only."""
    times: dict[str, dict[str, float]] = {}
    for pid, rec in records.items():
        if rec.ok:
            times.setdefault(types[pid], {})[pid] = rec.end - rec.start
    abnormal, by_type = [], {}
    for agent_type, runs in times.items():
        mean = float(np.mean(list(runs.values())))
        slow = sorted(pid for pid, t in runs.items() if t > ABNORMAL_FACTOR * mean)
        abnormal += slow
        by_type[agent_type] = {"agents": len(runs), "abnormal": len(slow), "mean_s": mean}
    finished = sum(len(r) for r in times.values())
    return {"abnormal_agents": len(abnormal), "abnormal_share": len(abnormal) / finished if finished else 0.0,
            "abnormal_by_type": by_type, "abnormal_ids": sorted(abnormal)}  # fmt: skip


def application_figures(
    result: ReplayResult, apps: Sequence[Application], aps: float, seed: int, kv: Sequence[Sequence[float]] = ()
) -> dict:
    """A run's application figures; ``kv``: ``[t, used, occupied]`` samples of the KV pool."""
    records = {p.program_id: p for p in result.programs}
    latencies, critical_abnormal = [], 0
    types = {app.program_id(a): a.agent_type for app in apps for a in app.agents}
    abnormal = abnormal_agents(records, types)
    slow = set(abnormal["abnormal_ids"])
    for app, at in zip(apps, arrival_times(len(apps), aps, seed)):
        agents = [records.get(app.program_id(a)) for a in app.agents]
        critical = critical_agents(app)
        critical_abnormal += sum(app.program_id(a) in slow for a in app.agents if a.agent_id in critical)
        if all(r is not None and r.ok for r in agents):
            latencies.append(max(r.end for r in agents) - at)
    used = [s[1] for s in kv]
    return {
        "applications": len(apps),
        "finished_apps": len(latencies),
        "failed_apps": len(apps) - len(latencies),
        "app_latency_mean_s": _mean(latencies),
        "app_latency_p50_s": _pct(latencies, 50),
        "app_latency_p90_s": _pct(latencies, 90),
        "app_latency_max_s": max(latencies) if latencies else None,
        "app_latencies_s": [round(v, 3) for v in latencies],
        "apps_per_s": len(latencies) / result.wall_s if result.wall_s else 0.0,
        **{k: v for k, v in abnormal.items() if k != "abnormal_ids"},
        "abnormal_critical": critical_abnormal,
        "kv_used_mean": _mean(used),
        "kv_used_peak": max(used) if used else None,
        "kv_occupied_mean": _mean(s[2] for s in kv if len(s) > 2),
        "kv_series": kv_series(kv),
    }
