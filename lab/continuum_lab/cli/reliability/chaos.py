"""Probe ``chaos``: sustained overload with clients that give up, forced retractions and queue-limit
rejections, under SGLang's strict checks and the plugin's integrity checks, on one fresh server per
seed. Afterwards the plugin must hold nothing: programs in flight, working-set tokens and pins back
to 0 once the server idles past the longest TTL, the pool empty, a new program's first turn served
within seconds, the server alive, and no request failed but those the chaos meant to fail.

The clients mix the ways an agent identifies its program (ids with a last-step flag, SGLang's
routing key alone, nothing at all, a streaming session whose id is the program's, and one id used
again for program after program, each ended by ``/close_session``, sometimes mid-turn) and the ways
a turn ends early: the client closes the stream, or calls ``/abort_request``; SGLang itself retracts
running turns (``SGLANG_TEST_RETRACT``) and turns away requests past ``--max-queued-requests``.
A streaming session is closed only once its last turn is over (a session whose client gave up
waiting is closed after the drain): closed with a turn in flight, SGLang 0.5.23 defers the close,
and sessions so closed kept their KV after the run, under lpm too (in-process), which would leave
the pool full of a leak that is not the plugin's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx

from continuum_lab.cli.reliability.common import (
    SHORT_IDLE_S,
    Ctx,
    E,
    ProbeResult,
    continuum_gauges,
    finish,
    limits,
    quantile,
    rand_ids,
    rnd,
    short_lifetimes,
)
from continuum_lab.harness.server import SGLangServer

STRICT = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
    "SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK": "1",
    "SGLANG_TEST_RETRACT": "1",  # SGLang's own switch: retract running turns every few decode steps
    "SGLANG_TEST_RETRACT_INTERVAL": "5",
    "SGLANG_TEST_RETRACT_NO_PREFILL_BS": "64",  # ... without starving prefill
}
IDENTITIES = ("ids", "routing-key", "none", "streaming", "reused-id")
GAUGES = ("programs_in_flight", "working_set_tokens", "pinned_programs")
QUEUE_LIMIT = 12


async def _turn(client, url: str, body: dict, ending: str, rng: random.Random, stats: Counter) -> list[int]:
    """One turn, streamed; ``ending``: "completes", "gives_up" (closes the stream) or "aborts"."""
    rid = body["rid"]
    out: list[int] = []
    try:
        async with client.stream("POST", url + "/generate", json=body, timeout=120) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                stats["rejected" if "queue is full" in text else f"http_{resp.status_code}"] += 1
                return []
            chunks = 0
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunks += 1
                if '"queue is full"' in line or "The request queue is full" in line:
                    stats["rejected"] += 1
                    return []
                if chunks == 2 and ending == "aborts":
                    await client.post(url + "/abort_request", json={"rid": rid}, timeout=30)
                if chunks == 2 and ending == "gives_up":
                    stats["gave_up"] += 1
                    return []  # leaving the block closes the stream: SGLang aborts the request
                out = _ids(line) or out
        stats["aborted" if ending == "aborts" and chunks >= 2 else "completed"] += 1
        return (out or [9] * body["sampling_params"]["max_new_tokens"]) if ending == "completes" else []
    except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError) as exc:
        stats[f"client_error_{type(exc).__name__}"] += 1
        return []


async def _open_session(client, url: str, pid: str, stats: Counter) -> bool:
    body = {"session_id": pid, "capacity_of_str_len": 1 << 16, "streaming": True}
    resp = await client.post(url + "/open_session", json=body, timeout=30)
    stats["sessions_opened" if resp.status_code == 200 else f"open_session_http_{resp.status_code}"] += 1
    return resp.status_code == 200


async def _close_session(client, url: str, pid: str, stats: Counter) -> None:
    resp = await client.post(url + "/close_session", json={"session_id": pid}, timeout=30)
    stats["sessions_closed" if resp.status_code == 200 else f"close_session_http_{resp.status_code}"] += 1


def _close_later(client, url: str, pid: str) -> None:
    asyncio.ensure_future(client.post(url + "/close_session", json={"session_id": pid}, timeout=30))


def _ids(line: str) -> list[int]:
    import json

    try:
        body = json.loads(line[len("data:") :])
    except ValueError:
        return []
    ids = body.get("output_ids") if isinstance(body, dict) else None
    return list(ids) if isinstance(ids, list) else []


async def _agent(
    client, url: str, n: int, seed: int, vocab: int, until: float, stats: Counter, unsettled: list[str]
) -> None:
    """``unsettled``: streaming sessions whose last turn may still run (the client gave up waiting):
    closed once the server has drained, not now."""
    rng = random.Random(seed * 7919 + n)
    program = 0
    while time.monotonic() < until:
        program += 1
        identity = IDENTITIES[(n + program) % len(IDENTITIES)]
        pid = f"chaos-{seed}-{n}-{program}" if identity != "reused-id" else f"chaos-{seed}-{n}-reused"
        streaming = identity == "streaming"
        if streaming and not await _open_session(client, url, pid, stats):
            continue
        # a streaming session holds its context between turns: kept short, or a few fill the pool
        context = rand_ids(rng, rng.randint(50, 150) if streaming else rng.randint(150, 600), vocab)
        turns = rng.randint(2, 3 if streaming else 6)
        settled = True
        for t in range(turns):
            last = t == turns - 1
            ending = rng.choices(("completes", "gives_up", "aborts"), (0.8, 0.12, 0.08))[0]
            if streaming:  # a session is closed once its turn is over (see the module's docstring)
                ending = "completes"
            sp: dict = {"max_new_tokens": rng.randint(8, 48), "ignore_eos": True, "temperature": 0.0}
            body: dict = {"input_ids": context, "sampling_params": sp, "stream": True, "rid": f"{pid}#{t}-{seed}"}
            if identity in ("ids", "streaming", "reused-id"):
                sp["custom_params"] = {"program_id": pid, "is_last_step": last, "tool_name": "bash"}
            elif identity == "routing-key":
                body["routing_key"] = pid
            if streaming:  # the session holds the context: a turn sends only what is new
                body["session_params"] = {"id": pid}
                body["rid"] += f"-{program}"
            stats["sent"] += 1
            if identity == "reused-id" and rng.random() < 0.2:  # ended while its turn is in flight
                asyncio.get_running_loop().call_later(0.05, _close_later, client, url, pid)
            out = await _turn(client, url, body, ending, rng, stats)
            settled = bool(out)
            if not out or ending != "completes" or time.monotonic() >= until:
                break  # the agent gives up on this program (it never says so)
            new = rand_ids(rng, rng.randint(20, 60 if streaming else 150), vocab)
            context = new if streaming else context + out + new
            await asyncio.sleep(rng.uniform(0.05, 1.0))  # the tool call
        if streaming and not settled:
            unsettled.append(pid)
        elif identity in ("streaming", "reused-id"):
            await _close_session(client, url, pid, stats)


def _wait_idle(srv: SGLangServer, timeout_s: float) -> None:
    """Until the server runs and queues nothing (``/v1/loads``), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            loads = httpx.get(srv.url + "/v1/loads", timeout=10).json()["loads"]
            if all(load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0 for load in loads):
                return
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        time.sleep(1.0)


def _gauges(srv: SGLangServer) -> dict[str, float]:
    g = continuum_gauges(srv)
    return {k: g.get(f"sglang:continuum_{k}") for k in GAUGES}


def _one_seed(ctx: Ctx, seed: int) -> dict:
    sizes = ctx.sizes
    env = {**STRICT, **short_lifetimes(idle_timeout_s=SHORT_IDLE_S), E + "CHECK_INTEGRITY": "1"}
    args = [*ctx.args("continuum"), "--max-queued-requests", str(QUEUE_LIMIT), "--enable-streaming-session"]
    srv = SGLangServer(ctx.model, args, env=env, log_path=ctx.logs / f"chaos-s{seed}.log")
    row: dict = {"seed": seed}
    stats: Counter = Counter()
    unsettled: list[str] = []
    with srv:
        until = time.monotonic() + sizes.chaos_s

        async def run() -> None:
            async with httpx.AsyncClient(limits=limits(sizes.chaos_clients)) as client:
                await asyncio.gather(
                    *(
                        _agent(client, srv.url, n, seed, ctx.vocab, until, stats, unsettled)
                        for n in range(sizes.chaos_clients)
                    )
                )

        asyncio.run(asyncio.wait_for(run(), timeout=sizes.chaos_s + 180))
        row["traffic"] = dict(stats)
        row["right_after"] = _gauges(srv)
        result = ProbeResult("chaos")
        _wait_idle(srv, 120.0)
        for pid in unsettled:  # nothing runs now: SGLang releases the session at once
            httpx.post(srv.url + "/close_session", json={"session_id": pid}, timeout=30)
        finish(result, srv, drain_s=5 + 2 + 30)  # the longest TTL, the wait hold, and the engine's drain
        row["drained"] = result.details.get("drain")
        row["problems"] = list(result.problems)
        deadline, gauges = time.monotonic() + 30, _gauges(srv)
        while any(v for v in gauges.values()) and time.monotonic() < deadline:
            time.sleep(1.0)
            gauges = _gauges(srv)
        row["gauges_after"] = gauges
        if any(v != 0 for v in gauges.values()):
            row["problems"].append(f"gauges not back to 0 once idle: {gauges}")
        rng = random.Random(seed)
        t0 = time.perf_counter()
        fresh = httpx.post(
            srv.url + "/generate",
            json={
                "input_ids": rand_ids(rng, 500, ctx.vocab),
                "sampling_params": {"max_new_tokens": 4, "custom_params": {"program_id": f"fresh-{seed}"}},
            },
            timeout=120,
        )
        row["fresh_first_turn_s"] = round(time.perf_counter() - t0, 3)
        if fresh.status_code != 200:
            row["problems"].append(f"a fresh program was not served: HTTP {fresh.status_code}")
        row["server_died"] = srv.proc is None or srv.proc.poll() is not None
    return row


def probe_chaos(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("chaos")
    seeds = ctx.sizes.chaos_seeds or [ctx.sizes.seed]
    rows = [_one_seed(ctx, seed) for seed in seeds]
    res.details["seeds"] = rows
    traffic = Counter()
    for row in rows:
        traffic.update(row["traffic"])
        for problem in row["problems"]:
            res.problem(f"seed {row['seed']}: {problem}")
        if row["server_died"]:
            res.server_died = True
            res.problem(f"seed {row['seed']}: the server died")
        if row["fresh_first_turn_s"] > ctx.sizes.chaos_fresh_max_s:
            res.problem(f"seed {row['seed']}: a fresh program waited {row['fresh_first_turn_s']} s")
    unexpected = {k: v for k, v in traffic.items() if k.startswith(("http_", "client_error"))}
    if unexpected:
        res.problem(f"requests failed that should not have: {unexpected}")
    res.sent = traffic["sent"]
    res.failed = sum(unexpected.values())
    fresh = [row["fresh_first_turn_s"] for row in rows]
    res.max_wait_s = rnd(max(fresh))
    res.p50_s = rnd(quantile(fresh, 0.5), 3)
    res.healthy_after = not res.server_died
    res.pins_empty = all(not row["gauges_after"].get("pinned_programs") for row in rows)
    res.pool_empty = all((row.get("drained") or {}).get("pool_empty") for row in rows)
    res.notes.append(
        f"{len(seeds)} seed(s) x {ctx.sizes.chaos_s:.0f} s of {ctx.sizes.chaos_clients} agents: "
        f"{traffic['sent']} turns, {traffic['completed']} completed, {traffic['gave_up']} given up, "
        f"{traffic['aborted']} aborted, {traffic['rejected']} rejected at the queue limit; right after: "
        f"{[row['right_after'] for row in rows]}; a fresh program's first turn {fresh} s"
    )
    return res
