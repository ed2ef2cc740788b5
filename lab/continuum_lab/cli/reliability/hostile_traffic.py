"""The hostile probe's honest traffic and its measurement: the agent programs that run beside each
attack, what a phase measures of them (throughput, cached share, inter-token latency, time to
first token), the server's gauges and counters around it, and the wait for a quiet server
between phases (``hostile.py`` runs the phases, ``hostile_attacks.py`` sends the attacks)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from typing import Any, Awaitable, Callable, Optional

import httpx

from continuum_lab.cli.reliability.common import (
    TOOLS,
    Ctx,
    apost,
    gen_body,
    limits,
    output_ids,
    quantile,
    rand_ids,
    rnd,
)
from continuum_lab.harness.server import SGLangServer, parse_metrics
from sglang_continuum.core.series import family_name, series_key

# the honest agent programs: a first prompt, then per turn the model's output and a tool's output
HONEST_FIRST = 192
HONEST_APPEND = 48
HONEST_OUTPUT = 16
HONEST_TURNS = 6
HONEST_GAP_S = (0.1, 0.4)
HONEST_TIMEOUT_S = 180.0
WARM_S = 1.0  # honest programs under way before the attack starts

# gauges sampled during each phase (peak and least): the door, the registry, the step's cost
GAUGES = (
    "programs_held_back",
    "tracked_programs",
    "programs_in_flight",
    "oldest_wait_seconds",
    "expected_final_context_tokens",
    "growth_reserved",
    "prefill_step_seconds",
    "decode_share_ratio",
    "pinned_programs",
)
SGLANG_GAUGES = ("sglang:num_queue_reqs", "sglang:num_running_reqs")
# counters read before and after each phase: report key -> the key parse_metrics gives it
COUNTERS = {
    "pins_created": series_key("counters.created"),
    "pin_hits": series_key("counters.hits"),
    "pin_sheds": family_name("pin_sheds"),  # every reason
    "pin_releases": series_key("counters.released"),
    "pins_refused": series_key("counters.refused"),
    "programs_ended_last_step": series_key("programs.last_step"),
    "programs_released": series_key("programs.released"),
    "programs_forgotten": series_key("programs.forgotten"),
    "held_back_requests": series_key("admission.held_back"),
    "stats_samples_received": series_key("exchange.received"),
    "requests_by_program_id": series_key("identity.program_id"),
    "requests_inferred": series_key("identity.inferred"),
    "requests_first_turn": series_key("identity.first_turn"),
    "requests_without_program": series_key("identity.none"),
}


# -- honest traffic ----------------------------------------------------------------------------
async def stream_turn(client: httpx.AsyncClient, url: str, body: dict, timeout: float) -> dict:
    """One streamed ``/generate``: status, latency, time to first token, the gaps between chunks
    (one token each: SGLang's stream interval is 1), and the final chunk's ``meta_info``."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    last: Optional[str] = None
    status: Optional[int] = None
    error: Optional[str] = None
    try:
        async with client.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=timeout) as resp:
            status = resp.status_code
            if status != 200:
                error = (await resp.aread()).decode("utf-8", "replace")[:200]
            else:
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and "[DONE]" not in line:
                        stamps.append(time.perf_counter())
                        last = line
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
        status = None
    end = time.perf_counter()
    body_out: Any = None
    if last is not None:
        try:
            body_out = json.loads(last[5:])
        except ValueError:
            error = error or "unreadable final chunk"
    meta = body_out.get("meta_info", {}) if isinstance(body_out, dict) else {}
    ok = status == 200 and error is None and body_out is not None
    return {
        "ok": ok,
        "status": status,
        "error": error,
        "t_send": t0,
        "t_end": end,
        "latency": end - t0,
        "ttft": (stamps[0] - t0) if stamps else None,
        "stamps": stamps,
        "tokens": int(meta.get("completion_tokens") or 0),
        "prompt": int(meta.get("prompt_tokens") or len(body["input_ids"])),
        "cached": int(meta.get("cached_tokens") or 0),
        "body": body_out,
    }


class Honest:
    """``lanes`` agents, each running programs of ``HONEST_TURNS`` turns one after another until
    ``stop``; a program cut by ``stop`` is ended with a last-step turn that is not counted."""

    def __init__(self, ctx: Ctx, url: str, tag: str) -> None:
        self.ctx, self.url, self.tag = ctx, url, tag
        self.stop = asyncio.Event()
        self.turns: list[dict] = []
        self.live: dict[str, int] = {}  # program id -> turns done (the attacker of ending_others reads it)
        self.ended: list[str] = []
        self.closing_failed = 0

    async def lane(self, client: httpx.AsyncClient, lane: int) -> None:
        rng = random.Random(f"{self.ctx.sizes.seed}:{lane}")  # the same programs in every phase
        vocab = self.ctx.vocab
        for n in itertools.count():
            if self.stop.is_set():
                return
            pid = f"honest-{self.tag}-{lane}-{n}"
            context = rand_ids(rng, HONEST_FIRST, vocab)
            self.live[pid] = 0
            for k in range(HONEST_TURNS):
                last = k == HONEST_TURNS - 1
                custom = {"program_id": pid, "is_last_step": last, "tool_name": None if last else rng.choice(TOOLS)}
                body = gen_body(context, HONEST_OUTPUT, custom, rid=f"{pid}-t{k}")
                rec = await stream_turn(client, self.url, body, HONEST_TIMEOUT_S)
                rec.update(pid=pid, turn=k, rid=body["rid"], lane=lane)
                reply = rec.pop("body")
                self.turns.append(rec)
                if not rec["ok"]:
                    break
                self.live[pid] = k + 1
                context = context + output_ids(reply, HONEST_OUTPUT)
                if last:
                    break
                if self.stop.is_set():  # end the program as its client would; not counted
                    end = gen_body(context + [5], 1, {"program_id": pid, "is_last_step": True}, rid=f"{pid}-end")
                    self.closing_failed += not (await apost(client, self.url + "/generate", end, timeout=120)).ok
                    break
                await asyncio.sleep(rng.uniform(*HONEST_GAP_S))
                context = context + rand_ids(rng, HONEST_APPEND, vocab)
            self.live.pop(pid, None)
            self.ended.append(pid)

    def summary(self, t0: float, t1: float) -> dict:
        """The window [t0, t1): tokens streamed in it, the gaps between tokens that overlap it,
        the turns that overlap it (cached share, failures), the turns sent in it (time to first
        token)."""
        turns = [t for t in self.turns if t["t_send"] < t1 and t["t_end"] >= t0]
        ok = [t for t in turns if t["ok"]]
        later = [t for t in ok if t["turn"] > 0]
        sent_in = [t for t in ok if t["t_send"] >= t0]
        tokens = sum(1 for t in ok for x in t["stamps"] if t0 <= x < t1)
        gaps = [b - a for t in ok for a, b in zip(t["stamps"], t["stamps"][1:]) if a < t1 and b >= t0]
        prompt = sum(t["prompt"] for t in later)
        ttft_later = [t["ttft"] for t in sent_in if t["turn"] > 0 and t["ttft"] is not None]
        ttft_first = [t["ttft"] for t in sent_in if t["turn"] == 0 and t["ttft"] is not None]
        ms = lambda x: rnd(None if x is None else x * 1000, 1)  # noqa: E731
        return {
            "turns": len(turns),
            "failed": len(turns) - len(ok),
            "errors": [f"{t['rid']}: {t['status'] or t['error']}" for t in turns if not t["ok"]][:5],
            "window_s": round(t1 - t0, 1),
            "tokens": tokens,
            "tok_s": round(tokens / (t1 - t0), 1) if t1 > t0 else None,
            "turn_tok_s_p50": rnd(quantile([t["tokens"] / t["latency"] for t in ok if t["latency"] > 0], 0.5), 1),
            "later_turns": len(later),
            "cached_share": round(sum(t["cached"] for t in later) / prompt, 3) if prompt else None,
            "itl_p50_ms": ms(quantile(gaps, 0.5)),
            "itl_p99_ms": ms(quantile(gaps, 0.99)),
            "itl_max_ms": ms(max(gaps, default=None)),
            "ttft_later_p50_ms": ms(quantile(ttft_later, 0.5)),
            "ttft_later_p99_ms": ms(quantile(ttft_later, 0.99)),
            "ttft_first_max_ms": ms(max(ttft_first, default=None)),
            "rids_later": [t["rid"] for t in later],
        }


# -- one phase ---------------------------------------------------------------------------------
async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    try:
        text = (await client.get(url + "/metrics", timeout=10)).text
    except httpx.HTTPError:
        return {}
    out = parse_metrics(text)
    for name in SGLANG_GAUGES:
        out.update(parse_metrics(text, prefix=name + "{") or parse_metrics(text, prefix=name + " "))
    return out


def _trim(name: str) -> str:
    return name.replace("sglang:continuum_", "").replace("sglang:", "sglang_")


#: what a phase runs beside the honest traffic: (the honest traffic, the attack's own client) -> its summary
RunAttack = Callable[[Honest, httpx.AsyncClient], Awaitable[dict]]


async def phase(
    ctx: Ctx,
    srv: SGLangServer,
    tag: str,
    attack: Optional[RunAttack],
    *,
    honest_headers: Optional[dict] = None,
    attack_headers: Optional[dict] = None,
) -> dict:
    """The honest traffic for a window: alone (``attack`` None: a baseline, ``hostile_baseline_s``)
    or beside ``attack`` (the window lasts the attack, at least ``hostile_min_s``). Each client
    sends its headers on every request (the tenant header that scopes program ids)."""
    s = ctx.sizes
    settle_s = await settle(srv, s.hostile_settle_s)
    honest = Honest(ctx, srv.url, tag)
    series: dict[str, list[float]] = {}
    lanes = s.hostile_lanes
    attack_conns = max(s.hostile_concurrency, s.hostile_held // s.hostile_batch + 1) + 16
    async with (
        httpx.AsyncClient(limits=limits(lanes + 2), headers=honest_headers or {}) as hc,
        httpx.AsyncClient(limits=limits(attack_conns), headers=attack_headers or {}) as ac,
    ):
        before = await scrape(hc, srv.url)

        async def sampler() -> None:
            while True:
                g = await scrape(hc, srv.url)
                for key in [*("sglang:continuum_" + n for n in GAUGES), *SGLANG_GAUGES]:
                    if key in g:
                        series.setdefault(_trim(key), []).append(g[key])
                await asyncio.sleep(s.hostile_sample_s)

        tasks = [asyncio.ensure_future(honest.lane(hc, i)) for i in range(lanes)]
        await asyncio.sleep(min(WARM_S, s.hostile_min_s / 2))
        samp = asyncio.ensure_future(sampler())
        t0 = time.perf_counter()
        out: dict = {}
        if attack is None:
            await asyncio.sleep(s.hostile_baseline_s)
        else:
            try:
                out = await attack(honest, ac)
            except Exception as exc:  # an attack that cannot run is reported, the probe goes on
                out = {"sent": 0, "attack_error": f"{type(exc).__name__}: {exc}"[:300]}
            left = s.hostile_min_s - (time.perf_counter() - t0)
            if left > 0:  # short attacks: the honest traffic is measured over a window of at least this
                await asyncio.sleep(left)
        t1 = time.perf_counter()
        honest.stop.set()
        await asyncio.gather(*tasks)
        samp.cancel()
        await asyncio.gather(samp, return_exceptions=True)
        after = await scrape(hc, srv.url)
    counters = {n: after.get(key, 0.0) - before.get(key, 0.0) for n, key in COUNTERS.items()}
    return {
        "tag": tag,
        "honest": honest.summary(t0, t1),
        "attack": out,
        "counters": {k: round(v, 1) for k, v in counters.items()},
        "gauges": {k: {"max": max(v), "min": min(v)} for k, v in series.items() if v},
        "closing_failed": honest.closing_failed,
        "settle_s": settle_s,
    }


async def settle(srv: SGLangServer, cap_s: float) -> float:
    """Wait (bounded) until nothing is queued, held or pinned: each phase starts from the same state."""
    t0 = time.monotonic()
    async with httpx.AsyncClient() as client:
        while time.monotonic() - t0 < cap_s:
            g = await scrape(client, srv.url)
            if not g:
                break
            busy = [g.get("sglang:num_queue_reqs", 0), g.get("sglang:continuum_programs_held_back", 0)]
            if not any(busy) and not g.get("sglang:continuum_pinned_programs", 0):
                break
            await asyncio.sleep(0.5)
    return round(time.monotonic() - t0, 1)
