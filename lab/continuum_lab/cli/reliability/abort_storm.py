"""Probe ``abort_storm``."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx

from continuum_lab.cli.reliability.common import (
    SHORT_ENV,
    SHORT_IDLE_S,
    TOOLS,
    Ctx,
    ProbeResult,
    apost,
    finish,
    gen_body,
    limits,
    output_ids,
    quantile,
    rand_ids,
    rnd,
    state,
)

STORM_KINDS = ("client_timeout", "stream_closed", "explicit_abort", "no_last_step", "completes")


async def _storm_program(
    client: httpx.AsyncClient, url: str, i: int, kind: str, vocab: int, seed: int, stats: dict
) -> None:
    rng = random.Random(seed * 100_003 + i)
    pid = f"storm-{seed}-{i}-{kind}"
    ids = rand_ids(rng, rng.randint(120, 260), vocab)
    await asyncio.sleep(rng.uniform(0, 2.0))
    custom = {"program_id": pid, "is_last_step": False, "tool_name": rng.choice(TOOLS)}
    r = await apost(client, url + "/generate", gen_body(ids, 8, custom), timeout=180)
    stats["sent"] += 1
    stats["lat"].append(r.latency)
    if not r.ok:
        stats["failed"] += 1
        stats["errors"].append(f"{pid} turn 1: {r.status or r.error}")
        return
    ctx_ids = ids + output_ids(r.body, 8) + rand_ids(rng, 30, vocab)
    await asyncio.sleep(rng.uniform(0.1, 1.0))  # the tool call
    if kind == "no_last_step":  # vanishes after turn 1, leaving its pin behind
        stats["outcomes"][kind] += 1
        return
    long_body = gen_body(ctx_ids, 400, {"program_id": pid, "is_last_step": False})
    stats["sent"] += 1
    t0 = time.perf_counter()
    if kind == "client_timeout":
        r = await apost(client, url + "/generate", long_body, timeout=rng.uniform(0.2, 1.5))
        stats["outcomes"][kind + (":timed_out" if r.status is None else f":{r.status}")] += 1
    elif kind in ("stream_closed", "explicit_abort"):
        rid = f"{pid}-t2"
        chunks = 0
        try:
            body = {**long_body, "stream": True, "rid": rid}
            async with client.stream("POST", url + "/generate", json=body, timeout=120) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    chunks += 1
                    if chunks == 1 and kind == "explicit_abort":
                        await client.post(url + "/abort_request", json={"rid": rid}, timeout=30)
                    if kind == "stream_closed" and chunks >= 2:
                        break  # closing the stream mid-generation
            stats["outcomes"][f"{kind}:chunks={'1-2' if chunks <= 2 else '>2'}"] += 1
        except httpx.HTTPError as exc:
            stats["outcomes"][f"{kind}:{type(exc).__name__}"] += 1
    else:  # completes: a well-behaved program, for contrast
        body = gen_body(ctx_ids, 4, {"program_id": pid, "is_last_step": True})
        r = await apost(client, url + "/generate", body, timeout=180)
        if not r.ok:
            stats["failed"] += 1
            stats["errors"].append(f"{pid} turn 2: {r.status or r.error}")
        stats["outcomes"][kind + f":{r.status}"] += 1
    stats["lat"].append(time.perf_counter() - t0)


def probe_abort_storm(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("abort_storm")
    n = ctx.sizes.storm_programs
    with ctx.server("abort_storm", env=SHORT_ENV) as srv:
        stats: dict = {"sent": 0, "failed": 0, "lat": [], "errors": [], "outcomes": Counter()}

        async def run() -> None:
            async with httpx.AsyncClient(limits=limits(n)) as client:
                kinds = [STORM_KINDS[i % len(STORM_KINDS)] for i in range(n)]
                await asyncio.gather(
                    *(_storm_program(client, srv.url, i, kinds[i], ctx.vocab, ctx.sizes.seed, stats) for i in range(n))
                )

        t0 = time.monotonic()
        try:
            asyncio.run(asyncio.wait_for(run(), timeout=ctx.sizes.storm_max_s))
        except asyncio.TimeoutError:
            res.notes.append(f"storm cut at {ctx.sizes.storm_max_s:.0f}s")
        res.details["storm_s"] = round(time.monotonic() - t0, 1)
        res.sent, res.failed = stats["sent"], stats["failed"]
        res.details["outcomes"] = dict(stats["outcomes"])
        res.details["errors"] = stats["errors"][:20]
        lat = stats["lat"]
        res.max_wait_s, res.p50_s, res.p99_s = (
            rnd(max(lat, default=None)),
            rnd(quantile(lat, 0.5), 3),
            rnd(quantile(lat, 0.99), 3),
        )
        idle = SHORT_IDLE_S
        right_after = state(srv)
        res.details["right_after_storm"] = right_after
        finish(res, srv, drain_s=idle + 20, tracked=idle <= 120)
        if res.failed:
            res.problem(f"{res.failed} request(s) that should have been served failed: {stats['errors'][:3]}")
        res.notes.append(
            f"{n} programs ({', '.join(STORM_KINDS)}, round-robin) in {res.details['storm_s']}s; right after: "
            f"pinned {right_after['pinned_programs']}, tracked {right_after['tracked_programs']}, used tokens "
            f"{right_after['used_tokens']}; back to empty in {res.details.get('drain', {}).get('drain_s')}s"
        )
    return res
