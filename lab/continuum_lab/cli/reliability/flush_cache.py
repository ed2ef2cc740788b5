"""Probe ``flush_cache``."""

from __future__ import annotations

import random
import time
from typing import Optional

import httpx

from continuum_lab.cli.reliability.common import (
    Ctx,
    ProbeResult,
    alive,
    continuum_gauges,
    finish,
    gen_body,
    output_ids,
    quantile,
    rand_ids,
    rnd,
    short_lifetimes,
    state,
)

PIN_PARTS = (
    "pins_created_total", "pin_hits_total", "pin_expiries_total", "pin_sheds_total", "pin_releases_total",
    "pins_flushed_total", "pins_refused_total",
)  # fmt: skip


def pin_balance(now: dict, before: dict, live: Optional[float]) -> dict:
    """created == hits + expiries + sheds + releases + flushed + live (refused pins were never
    created); a missing series counts as 0 and is reported as None."""
    parts = {}
    for name in PIN_PARTS:
        key = "sglang:continuum_" + name
        parts[name] = None if key not in now else now[key] - before.get(key, 0.0)
    ended = sum(v or 0.0 for n, v in parts.items() if n not in ("pins_created_total", "pins_refused_total"))
    accounted = ended + (live or 0.0)
    return {**parts, "live": live, "accounted": accounted, "adds_up": parts["pins_created_total"] == accounted}


def probe_flush_cache(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("flush_cache")
    k = ctx.sizes.flush_programs
    env = short_lifetimes(ttl_s=60, idle_timeout_s=90)
    rng = random.Random(ctx.sizes.seed + 3)
    with ctx.server("flush_cache", env=env) as srv:
        prompts = {f"flush-{i}": rand_ids(rng, 120 + 10 * i, ctx.vocab) for i in range(k)}
        lat = []
        before = continuum_gauges(srv)
        with httpx.Client() as client:

            def send(body: dict) -> Optional[dict]:
                t0 = time.perf_counter()
                r = client.post(srv.url + "/generate", json=body, timeout=120)
                lat.append(time.perf_counter() - t0)
                res.sent += 1
                if r.status_code != 200:
                    res.failed += 1
                    return None
                return r.json()

            outs = {}
            for pid, ids in prompts.items():  # turn 1 of each program: a live pin afterwards
                body = send(gen_body(ids, 4, {"program_id": pid, "is_last_step": False, "tool_name": "bash"}))
                if body is not None:
                    outs[pid] = output_ids(body, 4)
            time.sleep(1.0)
            pinned_before = state(srv)
            mid = continuum_gauges(srv)
            flush_status, flush_text = None, ""
            for _ in range(10):  # SGLang refuses a flush while requests run
                fr = client.post(srv.url + "/flush_cache", timeout=30)
                flush_status, flush_text = fr.status_code, fr.text[:120]
                if fr.status_code == 200:
                    break
                time.sleep(1.0)
            time.sleep(1.5)
            after_flush = state(srv)
            flushed_counters = continuum_gauges(srv)
            cached = []
            for pid, ids in prompts.items():  # the programs come back: served from scratch
                if pid in outs:
                    ctx_ids = ids + outs[pid] + rand_ids(rng, 10, ctx.vocab)
                    body = send(gen_body(ctx_ids, 2, {"program_id": pid, "is_last_step": True}))
                    if body is not None:
                        cached.append(body["meta_info"].get("cached_tokens", 0))
        res.max_wait_s, res.p50_s = rnd(max(lat)), rnd(quantile(lat, 0.5), 3)
        finish(res, srv, drain_s=20)
        end = continuum_gauges(srv)
        res.details.update(
            pinned_before_flush=pinned_before,
            flush_status=flush_status,
            flush_answer=flush_text,
            after_flush=after_flush,
            cached_tokens_next_turn=cached,
            balance_before_flush=pin_balance(mid, before, pinned_before["pinned_programs"]),
            balance_after_flush=pin_balance(flushed_counters, before, after_flush["pinned_programs"]),
            balance_end=pin_balance(end, before, state(srv)["pinned_programs"] if alive(srv) else None),
        )
        pb = pinned_before["pinned_programs"] or 0
        if pb < k:
            res.notes.append(f"only {pb:.0f} of {k} programs pinned before the flush")
        if pb == 0:
            res.problem("no live pins before the flush (the probe tested nothing)")
        if flush_status != 200:
            res.problem(f"/flush_cache answered {flush_status}: {flush_text}")
        if after_flush["pinned_programs"] != 0 or after_flush["used_tokens"] != 0:
            res.problem(
                f"after flush: pinned_programs={after_flush['pinned_programs']}, "
                f"used_tokens={after_flush['used_tokens']}"
            )
        bal = res.details["balance_after_flush"]
        if bal["pins_flushed_total"] is None:
            res.problem("no sglang:continuum_pins_flushed_total series: flushed pins counted nowhere")
        if not bal["adds_up"]:
            res.problem(
                f"pin counters do not add up after the flush: created {bal['pins_created_total']} != "
                f"hits+expiries+sheds+releases+flushed+live {bal['accounted']}"
            )
        if not res.details["balance_end"]["adds_up"] and alive(srv):
            res.problem(f"pin counters do not add up at the end: {res.details['balance_end']}")
        res.notes.append(
            f"{pb:.0f} pins live before the flush; flush {flush_status}; after: pinned "
            f"{after_flush['pinned_programs']}, used tokens {after_flush['used_tokens']}; pins_flushed_total "
            f"{bal['pins_flushed_total']}; created {bal['pins_created_total']} vs accounted {bal['accounted']}"
        )
        if res.failed:
            res.problem(f"{res.failed} request(s) failed around the flush")
    return res
