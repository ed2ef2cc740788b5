"""Probe ``pressure``."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
import zlib

import httpx

from sglang_continuum.cli.reliability.common import (
    TOOLS,
    Ctx,
    E,
    ProbeResult,
    apost,
    finish,
    gen_body,
    healthy,
    limits,
    output_ids,
    quantile,
    rand_ids,
    rnd,
)
from sglang_continuum.core.admission_log import read_admission_log, summarize_admissions
from sglang_continuum.harness.server import SGLangServer


def pressure_programs(ctx: Ctx) -> list[dict]:
    """Seeded: ``pressure_programs`` programs x ``pressure_turns`` turns whose contexts together
    are several times the pool; Poisson arrivals."""
    s = ctx.sizes
    rng = random.Random(s.seed + 11)
    t, out = 0.0, []
    for i in range(s.pressure_programs):
        turns = []
        for k in range(s.pressure_turns):
            last = k == s.pressure_turns - 1
            mean = s.pressure_first if k == 0 else s.pressure_append
            turns.append(
                {
                    "append": int(mean * rng.uniform(0.7, 1.3) if k == 0 else mean * rng.uniform(0.5, 1.5)),
                    "output": s.pressure_output,
                    "tool": None if last else rng.choice(TOOLS),
                    "tool_s": 0.0 if last else min(4.0, rng.lognormvariate(math.log(s.pressure_tool_s) - 0.32, 0.8)),
                }
            )
        out.append({"program_id": f"press-{s.seed}-{i:03d}", "arrival": t, "turns": turns})
        t += rng.expovariate(s.pressure_jps)
    return out


def _pressure_run(ctx: Ctx, srv: SGLangServer, programs: list[dict]) -> dict:
    recs: list[dict] = []
    t_start = time.perf_counter()

    async def program(client: httpx.AsyncClient, p: dict) -> None:
        rng = random.Random(zlib.crc32(f"{ctx.sizes.seed}:{p['program_id']}".encode()))
        await asyncio.sleep(p["arrival"])
        context: list[int] = []
        for k, turn in enumerate(p["turns"]):
            context += rand_ids(rng, turn["append"], ctx.vocab)
            last = k == len(p["turns"]) - 1
            custom = {"program_id": p["program_id"], "is_last_step": last, "tool_name": turn["tool"]}
            r = await apost(
                client,
                srv.url + "/generate",
                gen_body(context, turn["output"], custom),
                timeout=ctx.sizes.pressure_timeout,
            )
            meta = r.body.get("meta_info", {}) if isinstance(r.body, dict) else {}
            recs.append(
                {
                    "program": p["program_id"],
                    "turn": k,
                    "latency": r.latency,
                    "status": r.status,
                    "error": r.error,
                    "prompt": len(context),
                    "cached": meta.get("cached_tokens"),
                    "queue_s": meta.get("queue_time"),
                }
            )
            if not r.ok:
                return
            context += output_ids(r.body, turn["output"])
            if turn["tool_s"]:
                await asyncio.sleep(turn["tool_s"])

    async def run() -> None:
        async with httpx.AsyncClient(limits=limits(len(programs))) as client:
            await asyncio.gather(*(program(client, p) for p in programs))

    try:
        asyncio.run(asyncio.wait_for(run(), timeout=ctx.sizes.pressure_max_s))
        capped = False
    except asyncio.TimeoutError:
        capped = True
    wall = time.perf_counter() - t_start
    planned = sum(len(p["turns"]) for p in programs)
    ok = [r for r in recs if r["status"] == 200]
    lat = [r["latency"] for r in ok]
    failed = [r for r in recs if r["status"] != 200]
    queue = [r["queue_s"] for r in ok if r["queue_s"] is not None]
    prompt = sum(r["prompt"] for r in ok)
    cached = sum(r["cached"] or 0 for r in ok)
    return {
        "planned": planned,
        "sent": len(recs),
        "failed": len(failed),
        "not_sent": planned - len(recs),
        "timeouts": sum(1 for r in failed if r["error"] and "Timeout" in r["error"]),
        "errors": [f"{r['program']}/{r['turn']}: {r['status'] or r['error']}" for r in failed[:5]],
        "wall_s": round(wall, 1),
        "capped": capped,
        "p50_s": rnd(quantile(lat, 0.5), 2),
        "p90_s": rnd(quantile(lat, 0.9), 2),
        "p99_s": rnd(quantile(lat, 0.99), 2),
        "max_s": rnd(max(lat, default=None), 2),
        "max_latency_incl_failed_s": rnd(max((r["latency"] for r in recs), default=None), 2),
        "max_queue_s": rnd(max(queue, default=None), 2),
        "cache_hit": round(cached / prompt, 3) if prompt else None,
        "programs_completed": sum(1 for r in ok if r["turn"] == len(programs[0]["turns"]) - 1),
    }


def probe_pressure(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("pressure")
    programs = pressure_programs(ctx)
    contexts = [sum(t["append"] + t["output"] for t in p["turns"]) for p in programs]
    res.details["workload"] = {
        "programs": len(programs),
        "turns": ctx.sizes.pressure_turns,
        "final_context_mean": round(statistics.mean(contexts)),
        "sum_final_contexts": sum(contexts),
        "pool": ctx.sizes.pool,
        "arrival_span_s": round(programs[-1]["arrival"], 1),
    }
    runs = {}
    admission_log = (ctx.out / "pressure-admissions.jsonl").resolve()
    admission_log.unlink(missing_ok=True)
    for policy in ("fcfs", "continuum"):
        env = {E + "PROGRAM_IDLE_TIMEOUT_S": "400"}  # the default TTL model and bounds otherwise
        if policy == "continuum":  # per-request records, and the variant asked for (--pressure-env)
            env |= {E + "ADMISSION_LOG_PATH": str(admission_log)}
            env |= dict(kv.split("=", 1) for kv in getattr(ctx.sizes, "pressure_env", None) or [])
        with ctx.server(f"pressure-{policy}", policy=policy, env=env, share=False) as srv:
            runs[policy] = _pressure_run(ctx, srv, programs)
            if policy == "continuum":
                finish(res, srv, drain_s=60)
            elif not healthy(srv):
                res.problem("fcfs server not healthy after")
    runs["continuum"]["admissions"] = summarize_admissions(read_admission_log(admission_log), slowest=5)
    res.details["continuum_env"] = getattr(ctx.sizes, "pressure_env", None) or []
    res.details["runs"] = runs
    c, f = runs["continuum"], runs["fcfs"]
    res.sent, res.failed = c["sent"], c["failed"] + c["not_sent"]
    res.max_wait_s, res.p50_s, res.p99_s = c["max_latency_incl_failed_s"], c["p50_s"], c["p99_s"]
    f_max, c_max = f["max_latency_incl_failed_s"], c["max_latency_incl_failed_s"]
    ratio_max = c_max / f_max if (c_max and f_max) else None
    ratio_p50 = c["p50_s"] / f["p50_s"] if (c["p50_s"] and f["p50_s"]) else None
    res.details["slowest_ratio_continuum_over_fcfs"] = rnd(ratio_max, 2)
    res.details["median_ratio_continuum_over_fcfs"] = rnd(ratio_p50, 2)
    if res.failed:
        res.problem(f"continuum: {c['failed']} failed ({c['timeouts']} client timeouts), {c['not_sent']} never sent")
    if ratio_max is not None and ratio_max > 1.5:
        res.problem(f"continuum's slowest request {c_max}s > 1.5x fcfs's {f_max}s")
    if ratio_p50 is not None and ratio_p50 > ctx.sizes.median_tolerance and c["p50_s"] - f["p50_s"] > 0.1:
        res.problem(f"continuum's median {c['p50_s']}s worse than fcfs's {f['p50_s']}s")
    for name, r in (("fcfs", f), ("continuum", c)):
        res.notes.append(
            f"{name}: median {r['p50_s']}s, p99 {r['p99_s']}s, slowest {r['max_latency_incl_failed_s']}s, max queue "
            f"{r['max_queue_s']}s, failed {r['failed']} ({r['timeouts']} timeouts), not sent {r['not_sent']}, cache "
            f"hit {r['cache_hit']}, wall {r['wall_s']}s"
        )
    res.notes.append(
        f"slowest ratio {rnd(ratio_max, 2)} (target <= 1.5), median ratio {rnd(ratio_p50, 2)} "
        f"(target <= {ctx.sizes.median_tolerance})"
    )
    adm = c["admissions"]
    if adm:
        slow = "; ".join(
            f"{r['program_id']} turn {r['turn']}: waited {r['wait_s']:.2f}s, overtaken {r['overtaken']}"
            + (f" (budget {r['overtake_budget']})" if r.get("overtake_budget") else "")
            + (", overdue" if r["overdue"] else "")
            + (", held back" if r["held_back"] else "")
            + (", passed admission control overdue" if r["bypassed"] else "")
            for r in adm["slowest"]
        )
        res.notes.append(
            f"continuum's server-side waits: {adm['overdue_share']:.1%} of requests overdue when admitted, "
            f"{adm['held_back_share']:.1%} held back, {adm['bypassed']} let past admission control; mean wait "
            f"first turns {adm['mean_wait_first_turn_s']:.2f}s, later turns {adm['mean_wait_later_turns_s']:.2f}s; "
            f"slowest: {slow}"
        )
    return res
