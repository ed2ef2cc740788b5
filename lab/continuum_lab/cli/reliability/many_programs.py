"""Probe ``many_programs``."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from continuum_lab.cli.reliability.common import (
    TOOLS,
    Ctx,
    ProbeResult,
    apost,
    continuum_gauges,
    finish,
    gen_body,
    healthy,
    limits,
    quantile,
    rand_ids,
    rnd,
    short_lifetimes,
)
from continuum_lab.harness.server import SGLangServer


def server_rss(srv: SGLangServer) -> dict:
    import psutil

    try:
        root = psutil.Process(srv.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {"total_mb": None, "scheduler_mb": None}
    rows = []
    for p in procs:
        try:
            rows.append((" ".join(p.cmdline()) + " " + p.name(), p.memory_info().rss))
        except psutil.Error:
            continue
    sched = [rss for title, rss in rows if "scheduler" in title.lower()]
    children = [rss for _, rss in rows[1:]]
    return {
        "total_mb": round(sum(r for _, r in rows) / 2**20, 1),
        "scheduler_mb": round((max(sched) if sched else max(children, default=0)) / 2**20, 1),
    }


def _many(ctx: Ctx, srv: SGLangServer, n: int) -> dict:
    conc = ctx.sizes.many_concurrency
    stats: dict = {"sent": 0, "failed": 0, "lat": [], "errors": []}
    peak: dict = {"scheduler_mb": 0.0}
    deadline = 0.0

    async def worker(client: httpx.AsyncClient, q: asyncio.Queue) -> None:
        rng = random.Random(ctx.sizes.seed)
        while time.monotonic() < deadline:
            try:
                i = q.get_nowait()
            except asyncio.QueueEmpty:
                return
            custom = {
                "program_id": f"many-{ctx.sizes.seed}-{i}",
                "is_last_step": i % 2 == 0,
                "tool_name": TOOLS[i % len(TOOLS)],
            }
            r = await apost(client, srv.url + "/generate", gen_body(rand_ids(rng, 4, ctx.vocab), 1, custom), timeout=60)
            stats["sent"] += 1
            stats["lat"].append(r.latency)
            if not r.ok:
                stats["failed"] += 1
                if len(stats["errors"]) < 5:
                    stats["errors"].append(str(r.status or r.error))

    async def sampler() -> None:
        while time.monotonic() < deadline and stats["sent"] < n:
            peak["scheduler_mb"] = max(peak["scheduler_mb"], server_rss(srv)["scheduler_mb"] or 0.0)
            g = await asyncio.to_thread(continuum_gauges, srv)
            for key in ("programs_held_back", "programs_in_flight", "tracked_programs"):
                v = g.get("sglang:continuum_" + key)
                if v is not None:
                    peak[key] = max(peak.get(key, 0.0), v)
            await asyncio.sleep(2.0)

    async def run() -> None:
        q: asyncio.Queue = asyncio.Queue()
        for i in range(n):
            q.put_nowait(i)
        async with httpx.AsyncClient(limits=limits(conc)) as client:
            s = asyncio.create_task(sampler())
            await asyncio.gather(*(worker(client, q) for _ in range(conc)))
            s.cancel()

    with httpx.Client() as c:  # warm-up: allocator pools and caches, not program state
        for _ in range(20):
            c.post(srv.url + "/generate", json=gen_body([5, 6, 7, 8], 1), timeout=60)
    time.sleep(1.0)
    rss0 = server_rss(srv)
    t0 = time.monotonic()
    deadline = t0 + ctx.sizes.many_max_s
    asyncio.run(run())
    wall = time.monotonic() - t0
    time.sleep(1.0)
    rss1 = server_rss(srv)
    gauges = continuum_gauges(srv)
    return {
        "sent": stats["sent"],
        "failed": stats["failed"],
        "errors": stats["errors"],
        "wall_s": round(wall, 1),
        "req_per_s": round(stats["sent"] / wall, 1) if wall else None,
        "lat": stats["lat"],
        "rss_before": rss0,
        "rss_after": rss1,
        "rss_peak_scheduler_mb": peak["scheduler_mb"],
        "scheduler_growth_mb": round((rss1["scheduler_mb"] or 0) - (rss0["scheduler_mb"] or 0), 1),
        "tracked_after": gauges.get("sglang:continuum_tracked_programs"),
        "admission": {
            "held_back_requests_total": gauges.get("sglang:continuum_held_back_requests_total"),
            "peak_programs_held_back": peak.get("programs_held_back"),
            "peak_programs_in_flight": peak.get("programs_in_flight"),
            "peak_tracked_programs": peak.get("tracked_programs"),
        },
    }


def probe_many_programs(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("many_programs")
    n = ctx.sizes.programs
    env = short_lifetimes(idle_timeout_s=ctx.sizes.idle_timeout)
    runs = {}
    for policy in ("fcfs", "continuum"):
        with ctx.server(f"many_programs-{policy}", policy=policy, env=env, share=False) as srv:
            run = _many(ctx, srv, n)
            lat = run.pop("lat")
            run.update(
                p50_s=rnd(quantile(lat, 0.5), 3), p99_s=rnd(quantile(lat, 0.99), 3), max_s=rnd(max(lat, default=None))
            )
            if policy == "continuum":
                res.sent, res.failed = run["sent"], run["failed"]
                res.p50_s, res.p99_s, res.max_wait_s = run["p50_s"], run["p99_s"], run["max_s"]
                finish(res, srv, drain_s=ctx.sizes.idle_timeout + 20, tracked=True)
                run["rss_after_idle_timeout"] = server_rss(srv)
            else:
                run["healthy_after"] = healthy(srv)
                if not run["healthy_after"]:
                    res.problem("fcfs server not healthy after")
            runs[policy] = run
    res.details["runs"] = runs
    c, f = runs.get("continuum", {}), runs.get("fcfs", {})
    extra_mb = (c.get("scheduler_growth_mb") or 0) - (f.get("scheduler_growth_mb") or 0)
    per_program = extra_mb * 2**20 / max(1, c.get("sent", 0))
    res.details["extra_scheduler_mb_vs_fcfs"] = round(extra_mb, 1)
    res.details["extra_bytes_per_program"] = round(per_program)
    tracked_end = res.details.get("drain", {}).get("final", {}).get("tracked_programs")
    res.notes.append(
        f"{c.get('sent')} program ids at {c.get('req_per_s')} req/s (fcfs {f.get('req_per_s')}); scheduler RSS "
        f"+{c.get('scheduler_growth_mb')} MB vs +{f.get('scheduler_growth_mb')} MB under fcfs (~{per_program:.0f} B "
        f"per program beyond fcfs); tracked programs right after {c.get('tracked_after')}, after the "
        f"{ctx.sizes.idle_timeout:.0f}s idle timeout {tracked_end}"
    )
    if c.get("sent", 0) < n:
        res.notes.append(f"time cap reached: {c.get('sent')} of {n} sent")
    g = c.get("admission", {})
    res.notes.append(
        f"continuum admission control: {g.get('held_back_requests_total')} first turns held back, up to "
        f"{g.get('peak_programs_held_back')} at once, {g.get('peak_programs_in_flight')} programs in flight at peak"
    )
    if f.get("failed"):
        res.notes.append(f"fcfs (for comparison): {f['failed']} failed ({f.get('errors')})")
    if res.failed:
        res.problem(f"{res.failed} request(s) failed: {c.get('errors')}")
    if per_program > ctx.sizes.max_bytes_per_program:
        res.problem(
            f"{per_program:.0f} B of scheduler memory per program beyond fcfs (bound {ctx.sizes.max_bytes_per_program})"
        )
    return res
