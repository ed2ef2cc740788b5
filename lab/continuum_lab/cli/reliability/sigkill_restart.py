"""Probe ``sigkill_restart`` (and the agent traffic ``bad_stats`` uses)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import httpx

from continuum_lab.cli.reliability.common import (
    SHORT_IDLE_S,
    TOOLS,
    Ctx,
    E,
    ProbeResult,
    alive,
    apost,
    drain,
    gen_body,
    healthy,
    log_tail,
    log_text,
    output_ids,
    quantile,
    rand_ids,
    rnd,
    short_lifetimes,
)
from continuum_lab.harness.server import SGLangServer


async def _agent_loop(
    url: str, vocab: int, seed: int, stop: asyncio.Event, stats: dict, *, programs: int, turns: int = 3
) -> None:
    """``programs`` concurrent agents, each running ``turns``-turn programs back to back until
    ``stop``: the tool gaps are the statistics' samples."""

    async def agent(a: int) -> None:
        rng = random.Random(seed * 7919 + a)
        k = 0
        async with httpx.AsyncClient() as client:
            while not stop.is_set():
                pid = f"agent-{seed}-{a}-{k}"
                k += 1
                ids = rand_ids(rng, rng.randint(60, 140), vocab)
                for t in range(turns):
                    last = t == turns - 1
                    custom = {"program_id": pid, "is_last_step": last, "tool_name": None if last else rng.choice(TOOLS)}
                    r = await apost(client, url + "/generate", gen_body(ids, 4, custom), timeout=60)
                    stats["sent"] += 1
                    if not r.ok:
                        stats["killed" if stop.is_set() else "failed"] += 1
                        if not stop.is_set():
                            stats["errors"].append(f"{pid}/{t}: {r.status or r.error}")
                        return
                    stats["lat"].append(r.latency)
                    ids = ids + output_ids(r.body, 4) + rand_ids(rng, 20, vocab)
                    if stop.is_set():
                        return
                    await asyncio.sleep(rng.uniform(0.2, 0.6))

    await asyncio.gather(*(agent(a) for a in range(programs)))


def mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def read_stats_file(path: Path) -> dict:
    from sglang_continuum.core.persistence import read_stats

    out: dict = {"exists": path.is_file(), "valid_json": False, "schema_ok": False, "samples": 0}
    if not out["exists"]:
        return out
    try:
        json.loads(path.read_bytes())
        out["valid_json"] = True
    except ValueError:
        return out
    parsed = read_stats(path)
    out["schema_ok"] = parsed is not None
    if parsed is not None:
        out["samples"] = sum(len(v) for v in parsed.tool_stats.tools.values())
        out["tools"] = sorted(parsed.tool_stats.tools)
    return out


async def _load_then_kill(ctx: Ctx, srv: SGLangServer, seed: int, stats: dict) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(_agent_loop(srv.url, ctx.vocab, seed, stop, stats, programs=ctx.sizes.kill_agents))
    await asyncio.sleep(ctx.sizes.kill_after_s)
    stop.set()  # requests failing from here on were in flight at the kill
    os.killpg(srv.proc.pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(task, timeout=90)
    except asyncio.TimeoutError:
        task.cancel()


async def _traffic(
    ctx: Ctx,
    srv: SGLangServer,
    seconds: float,
    stats: dict,
    agents: int = 2,
    min_requests: int = 0,
    cap_s: float = 60.0,
) -> None:
    """Agent traffic for ``seconds``, and on until ``min_requests`` were sent (at most ``cap_s``):
    a freshly started CPU server can be slow enough that a few seconds bring no tool sample."""
    stop = asyncio.Event()
    sent0, t0 = stats["sent"], time.monotonic()
    task = asyncio.create_task(_agent_loop(srv.url, ctx.vocab, ctx.sizes.seed, stop, stats, programs=agents))
    await asyncio.sleep(seconds)
    while stats["sent"] - sent0 < min_requests and time.monotonic() - t0 < cap_s and not task.done():
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.wait_for(task, timeout=90)


def sigterm(srv: SGLangServer, *, group: bool = True, timeout_s: float = 30.0) -> Optional[float]:
    """SIGTERM to the process group (systemd's default, ``kill -TERM -PGID``) or to the launcher
    alone (``kill PID``); seconds to exit (None: still running after ``timeout_s``, or already dead)."""
    if not alive(srv):
        return None
    t0 = time.monotonic()
    if group:
        os.killpg(srv.proc.pid, signal.SIGTERM)
    else:
        srv.proc.send_signal(signal.SIGTERM)
    try:
        srv.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    return round(time.monotonic() - t0, 1)


def probe_sigkill_restart(ctx: Ctx) -> ProbeResult:
    """``kill_cycles`` x (start or restart, load, SIGKILL the process group, check the stats file),
    then a last restart that must load the file and serve; it runs with a 1 h save interval and is
    stopped with SIGTERM, so the file only grows if statistics are saved at shutdown. With
    ``--kill-initial`` the first start finds that content in the file (e.g. a wrong shape).

    A shared server (tests) started with a stats path is the first cycle's server: this probe kills
    it (``ctx.shared`` is None afterwards), so it runs after the probes that share it."""
    res = ProbeResult("sigkill_restart")
    first = ctx.shared if ctx.shared is not None and E + "STATS_PATH" in ctx.shared.env else None
    if first is not None:
        path = Path(first.env[E + "STATS_PATH"])
        res.notes.append("first cycle on the shared server")
    else:
        path = ctx.logs / "sigkill-stats.json"
        path.unlink(missing_ok=True)
        if ctx.sizes.kill_initial:
            path.write_text(ctx.sizes.kill_initial)
    cycles = ctx.sizes.kill_cycles
    per_cycle = []
    stats: dict = {"sent": 0, "failed": 0, "killed": 0, "lat": [], "errors": []}
    for cycle in range(cycles + 1):
        last = cycle == cycles
        interval = 3600.0 if last else 1.0
        env = {
            **short_lifetimes(idle_timeout_s=SHORT_IDLE_S, stats_save_interval_s=interval),
            E + "STATS_PATH": str(path),
        }
        row: dict = {"cycle": cycle, "save_interval_s": interval}
        per_cycle.append(row)
        if cycle == 0 and first is not None:
            srv, ctx.shared = first, None
            row["save_interval_s"] = None  # the shared server's
        else:
            srv = ctx.new_server(f"sigkill_restart-{cycle}", env=env)
        try:
            if not alive(srv):
                srv.start()
        except (RuntimeError, TimeoutError) as exc:
            row["started"] = False
            res.problem(f"start {cycle} failed: {exc}; log: {log_tail(srv, 2)}")
            srv.stop()
            break
        row["started"] = True
        try:
            if cycle > 0:
                row["loaded_stats_logged"] = "loaded tool statistics" in log_text(srv)
                if not row["loaded_stats_logged"]:
                    res.problem(f"restart {cycle}: no 'loaded tool statistics' in the log")
            r = httpx.post(srv.url + "/generate", json=gen_body([5, 6, 7, 8], 2), timeout=60)
            row["serves"] = r.status_code == 200
            res.sent += 1
            if not row["serves"]:
                res.failed += 1
                res.problem(f"cycle {cycle}: first request got {r.status_code}")
            if not last:
                asyncio.run(_load_then_kill(ctx, srv, ctx.sizes.seed + cycle, stats))
                srv.proc.wait(timeout=30)
                row["exit"] = srv.proc.returncode
                row["file"] = read_stats_file(path)
                if not (row["file"]["valid_json"] and row["file"]["schema_ok"]):
                    res.problem(f"cycle {cycle}: stats file after SIGKILL not valid: {row['file']}")
                continue
            # the last restart: load, drain, SIGTERM (statistics must be saved at shutdown)
            before = read_stats_file(path)["samples"]
            agents = ctx.sizes.kill_agents
            asyncio.run(_traffic(ctx, srv, ctx.sizes.kill_after_s, stats, agents=agents, min_requests=3 * agents))
            res.healthy_after = healthy(srv)
            d = drain(srv, 15)
            res.pins_empty, res.pool_empty = d["pins_empty"], d["pool_empty"]
            mtime = mtime_ns(path)
            row["sigterm_exit_s"] = sigterm(srv, group=True)
            row["launcher_reported_a_crash"] = "crashed with exit code" in log_text(srv)
            row["file"] = read_stats_file(path)
            row["samples_before_sigterm"] = before
            row["file_rewritten_at_sigterm"] = mtime_ns(path) > mtime
            row["saved_at_sigterm"] = (
                row["file_rewritten_at_sigterm"] and row["file"]["schema_ok"] and row["file"]["samples"] > before
            )
            if not row["saved_at_sigterm"]:
                res.problem(
                    f"statistics not saved at SIGTERM: {before} samples before, file rewritten "
                    f"{row['file_rewritten_at_sigterm']}, now {row['file']}"
                )
        finally:
            srv.stop()
    res.sent += stats["sent"]
    res.failed += stats["failed"]
    lat = stats["lat"]
    res.max_wait_s, res.p50_s, res.p99_s = (
        rnd(max(lat, default=None)),
        rnd(quantile(lat, 0.5), 3),
        rnd(quantile(lat, 0.99), 3),
    )
    res.details.update(cycles=per_cycle, killed_in_flight=stats["killed"], errors=stats["errors"][:10])
    if stats["failed"]:
        res.problem(f"{stats['failed']} request(s) failed before a kill: {stats['errors'][:3]}")
    if res.healthy_after is False:
        res.problem("not healthy after the last restart")
    if res.pins_empty is False or res.pool_empty is False:
        res.problem(f"not empty after the last restart: pins {res.pins_empty}, pool {res.pool_empty}")
    files = [c["file"] for c in per_cycle[:-1] if "file" in c]
    loaded = sum(bool(c.get("loaded_stats_logged")) for c in per_cycle[1:])
    final = per_cycle[-1] if len(per_cycle) == cycles + 1 else {}
    res.notes.append(
        (f"first start on {ctx.sizes.kill_initial!r}; " if ctx.sizes.kill_initial else "")
        + f"{cycles} SIGKILL(s) under load: stats file valid {sum(f['schema_ok'] for f in files)}/{len(files)} "
        f"(samples {[f['samples'] for f in files]}); loaded on restart {loaded}/{len(per_cycle) - 1}; "
        f"{stats['killed']} request(s) in flight at the kills; last restart saved at SIGTERM (process group): "
        f"{final.get('saved_at_sigterm')} ({final.get('samples_before_sigterm')} -> "
        f"{final.get('file', {}).get('samples')} samples, exit in {final.get('sigterm_exit_s')}s"
        + (
            "; the launcher logged the scheduler's SIGTERM exit as a crash"
            if final.get("launcher_reported_a_crash")
            else ""
        )
        + ")"
    )
    return res
