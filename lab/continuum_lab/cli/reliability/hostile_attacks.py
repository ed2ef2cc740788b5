"""The hostile probe's attack patterns (``hostile.py`` runs each beside the honest traffic of
``hostile_traffic.py``): what each sends, and its own summary of what it sent and got back."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Iterator, Optional

import httpx

from continuum_lab.cli.reliability.common import (
    TOOLS,
    Ctx,
    apost,
    gen_body,
    log_text,
    output_ids,
    quantile,
    rand_ids,
    rnd,
)
from continuum_lab.cli.reliability.hostile_traffic import Honest
from continuum_lab.harness.server import SGLangServer

PATTERNS = (
    "identical_prompts",
    "distinct_ids",
    "held_turns",
    "ending_others",
    "ending_others_unscoped",
    "tiny_programs",
    "peer_stats",
    "bad_metadata_rate",
)
# the review finding each pattern stands for
FINDING = {
    "identical_prompts": "H2",
    "distinct_ids": "M6",
    "held_turns": "M7",
    "ending_others": "M9",
    "ending_others_unscoped": "M9",
    "tiny_programs": "M5",
    "peer_stats": "L8",
    "bad_metadata_rate": "L13",
}


# -- attack helpers ----------------------------------------------------------------------------
def _body(items: list[tuple[list[int], dict]], rids: Optional[list[str]] = None) -> dict:
    if len(items) == 1:
        body: dict = {"input_ids": items[0][0], "sampling_params": items[0][1]}
        if rids:
            body["rid"] = rids[0]
        return body
    body = {"input_ids": [ids for ids, _ in items], "sampling_params": [sp for _, sp in items]}
    if rids:
        body["rid"] = rids
    return body


def _sp(max_new: int = 1, custom: Any = None, *, omit: bool = False) -> dict:
    sp: dict = {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0.0}
    if not omit:
        sp["custom_params"] = custom
    return sp


async def flood(
    client: httpx.AsyncClient,
    url: str,
    items: Iterator[tuple[list[int], dict]],
    *,
    batch: int,
    concurrency: int,
    deadline: float,
    timeout: float = 120.0,
) -> dict:
    """Send ``items`` (prompt, sampling params), ``batch`` per ``/generate``, from ``concurrency``
    workers, until they run out or ``deadline``."""
    stats: dict = {"sent": 0, "requests": 0, "statuses": Counter(), "lat": [], "errors": []}

    async def worker() -> None:
        while time.monotonic() < deadline:
            chunk = list(itertools.islice(items, batch))
            if not chunk:
                return
            r = await apost(client, url + "/generate", _body(chunk), timeout=timeout)
            stats["sent"] += len(chunk)
            stats["requests"] += 1
            stats["statuses"][str(r.status) if r.status is not None else "error"] += len(chunk)
            stats["lat"].append(r.latency)
            if not r.ok and len(stats["errors"]) < 5:
                stats["errors"].append(str(r.status or r.error) + " " + str(r.body)[:120])

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _flood_summary(stats, time.monotonic() - t0)


def _flood_summary(stats: dict, wall: float) -> dict:
    lat = stats.pop("lat")
    return {
        **stats,
        "statuses": dict(stats["statuses"]),
        "attack_s": round(wall, 1),
        "per_s": round(stats["sent"] / wall, 1) if wall > 0 else None,
        "request_p50_s": rnd(quantile(lat, 0.5), 3),
        "request_max_s": rnd(max(lat, default=None), 3),
    }


class Attack:
    """What an attack needs: the sizes, the server, a client of its own, the honest traffic."""

    def __init__(self, ctx: Ctx, srv: SGLangServer, client: httpx.AsyncClient, honest: Honest, peer: str) -> None:
        self.ctx, self.srv, self.client, self.honest, self.peer = ctx, srv, client, honest, peer
        self.s = ctx.sizes
        self.url = srv.url
        self.rng = random.Random(f"attack:{ctx.sizes.seed}:{honest.tag}")
        self.deadline = time.monotonic() + ctx.sizes.hostile_max_s

    def ids(self, n: int) -> list[int]:
        return rand_ids(self.rng, n, self.ctx.vocab)

    def flood(self, items: Iterator[tuple[list[int], dict]], **kw) -> Awaitable[dict]:
        kw.setdefault("batch", self.s.hostile_batch)
        kw.setdefault("concurrency", self.s.hostile_concurrency)
        return flood(self.client, self.url, items, deadline=self.deadline, **kw)


async def atk_identical_prompts(a: Attack) -> dict:
    prompt = a.ids(128)
    n = a.s.hostile_identical
    return await a.flood((prompt, _sp(1, omit=True)) for _ in range(n))


async def atk_distinct_ids(a: Attack) -> dict:
    n, tag = a.s.hostile_ids, a.honest.tag
    # no is_last_step: a client that announces no ends (as with a routing key per user), so each
    # id stays in the registry until it idles out (15 minutes by default)
    items = ((a.ids(4), _sp(1, {"program_id": f"atk-{tag}-{i}"})) for i in range(n))
    out = await a.flood(items)
    out["ids_sent"] = out["sent"]
    return out


async def atk_held_turns(a: Attack) -> dict:
    """All first turns at once (non-final, 160-token prompts): the door admits a few and holds the
    rest while the working set fills the pool; after ``hostile_hold_s`` they are aborted."""
    n, tag, batch = a.s.hostile_held, a.honest.tag, a.s.hostile_batch
    rids = [f"held-{tag}-{i}" for i in range(n)]
    items = [(a.ids(160), _sp(4, {"program_id": f"held-{tag}-{i}", "is_last_step": False})) for i in range(n)]
    t0 = time.monotonic()
    timeout = a.s.hostile_hold_s + 120
    tasks = [
        asyncio.ensure_future(
            apost(a.client, a.url + "/generate", _body(items[i : i + batch], rids[i : i + batch]), timeout=timeout)
        )
        for i in range(0, n, batch)
    ]
    await asyncio.sleep(a.s.hostile_hold_s)
    done = [t.result() for t in tasks if t.done()]
    served = sum(min(batch, n - i) for i, t in zip(range(0, n, batch), tasks) if t.done() and t.result().ok)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    sem = asyncio.Semaphore(16)

    async def abort(rid: str) -> bool:
        async with sem:
            return (await apost(a.client, a.url + "/abort_request", {"rid": rid}, timeout=30)).ok

    aborts = await asyncio.gather(*(abort(r) for r in rids))
    return {
        "sent": n,
        "requests": len(tasks),
        "attack_s": round(time.monotonic() - t0, 1),
        "served_within_hold": served,
        "batches_done_within_hold": len(done),
        "aborted_ok": sum(aborts),
        "statuses": dict(Counter(str(r.status) for r in done)),
    }


async def atk_ending_others(a: Attack) -> dict:
    """Every 0.1 s an action against one of the honest programs, in rotation: its id with
    ``is_last_step`` (ends it), ``/close_session`` with its id (ends it), a non-final turn with its
    id and another prompt (takes its turn: the pin replaced), a first turn with an id the honest
    client ended (reuse: its rank?). The turns' rids and their targets are kept: the event log says
    whether each joined the honest program (the same program id logged)."""
    n, period, tag = a.s.hostile_endings, 0.1, a.honest.tag
    actions = ("last_step", "close_session", "hijack", "reuse_ended")
    done: Counter = Counter()
    statuses: Counter = Counter()
    targets: set[str] = set()
    attack_turns: list[tuple[str, str]] = []  # (rid, the honest program id it names)
    t0 = time.monotonic()
    window = a.deadline - t0
    # nothing to act on until an honest program has a turn done (a loaded server's first turns take
    # seconds): the wait for one does not eat the window, which runs from the first target
    ready = t0 + max(10.0, window)
    while not any(turns > 0 for turns in a.honest.live.values()) and time.monotonic() < ready:
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + window
    for i in range(n):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(period)
        kind = actions[i % len(actions)]
        live = sorted(pid for pid, turns in a.honest.live.items() if turns > 0)
        rid = f"{kind}-{tag}-{i}"
        if kind == "reuse_ended":
            if not a.honest.ended:
                continue
            pid = a.rng.choice(a.honest.ended)
            body = gen_body(a.ids(32), 2, {"program_id": pid, "is_last_step": False, "tool_name": "bash"}, rid=rid)
            r = await apost(a.client, a.url + "/generate", body, timeout=120)
            attack_turns.append((rid, pid))
        elif not live:
            continue
        else:
            pid = a.rng.choice(live)
            targets.add(pid)
            if kind == "close_session":
                r = await apost(a.client, a.url + "/close_session", {"session_id": pid}, timeout=30)
            else:
                custom = {"program_id": pid, "is_last_step": kind == "last_step", "tool_name": "bash"}
                r = await apost(a.client, a.url + "/generate", gen_body(a.ids(16), 1, custom, rid=rid), timeout=120)
                attack_turns.append((rid, pid))
        done[kind] += 1
        statuses[f"{kind}:{r.status}"] += 1
    return {
        "sent": sum(done.values()),
        "attack_s": round(time.monotonic() - t0, 1),
        "actions": dict(done),
        "statuses": dict(statuses),
        "honest_programs_targeted": len(targets),
        "attack_turns": attack_turns,
    }


async def atk_tiny_programs(a: Attack) -> dict:
    """2-turn programs of a few tokens (the second turn the last), ``hostile_batch`` programs per
    request, from ``hostile_concurrency`` workers."""
    n, tag, batch = a.s.hostile_tiny, a.honest.tag, a.s.hostile_batch
    counter = itertools.count()
    stats: dict = {"sent": 0, "requests": 0, "statuses": Counter(), "lat": [], "errors": []}

    async def worker() -> None:
        while time.monotonic() < a.deadline:
            idx = [i for i in itertools.islice(counter, batch) if i < n]
            if not idx:
                return
            prompts = [a.ids(4) for _ in idx]
            first = [(p, _sp(1, {"program_id": f"tiny-{tag}-{i}", "is_last_step": False, "tool_name": "bash"}))
                     for p, i in zip(prompts, idx)]  # fmt: skip
            r = await apost(a.client, a.url + "/generate", _body(first), timeout=120)
            stats["requests"] += 1
            stats["sent"] += len(idx)
            stats["statuses"][str(r.status)] += len(idx)
            stats["lat"].append(r.latency)
            if not r.ok:
                continue
            outs = r.body if isinstance(r.body, list) else [r.body]
            second = [
                (p + output_ids(o, 1) + a.ids(2), _sp(1, {"program_id": f"tiny-{tag}-{i}", "is_last_step": True}))
                for p, o, i in zip(prompts, outs, idx)
            ]
            r = await apost(a.client, a.url + "/generate", _body(second), timeout=120)
            stats["requests"] += 1
            stats["sent"] += len(idx)
            stats["statuses"][str(r.status)] += len(idx)
            stats["lat"].append(r.latency)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(a.s.hostile_concurrency)))
    out = _flood_summary(stats, time.monotonic() - t0)
    out["programs"] = out["sent"] // 2
    return out


async def atk_peer_stats(a: Attack) -> dict:
    """A fake peer on the endpoint the server subscribes to: every 0.1 s a message of 256 samples
    for the honest programs' tools, of 1e308 s (finite: accepted by the reader, and its squares
    overflow), non-printable tool names; every fifth message a raw one with non-finite literals
    (1e309, NaN) and negative values."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(a.peer)
    seq, messages, samples = 0, Counter(), 0
    t0 = time.monotonic()
    end = t0 + a.s.hostile_peer_s
    try:
        await asyncio.sleep(0.5)  # the server's SUB socket reconnects (100 ms) and subscribes
        for i in itertools.count():
            if time.monotonic() >= end:
                break
            if i % 5 == 4:
                raw = (
                    b'{"o": "hostile-peer", "f": 1, "h": %d, "s": [[%d, "d", "bash", 1e309], [%d, "d", "grep", NaN],'
                    b' [%d, "d", "sed", -1.0]]}' % (seq + 3, seq + 1, seq + 2, seq + 3)
                )
                seq += 3
                kind = "non_finite_raw"
            else:
                rows = []
                seq += 1
                rows.append([seq, "d", "peer-control", 0.25])  # a sound sample: is the channel up?
                for j in range(255):
                    seq += 1
                    tool = TOOLS[j % len(TOOLS)] if j % 8 else f"to\x1bol\n{j}"
                    value = (1e308, 1.7e308, 5e307, 1e300)[j % 4]
                    rows.append([seq, "d", tool, value])
                raw = json.dumps({"o": "hostile-peer", "f": 1, "h": seq, "s": rows}).encode()
                samples += len(rows)
                kind = "oversized"
            try:
                sock.send(raw, zmq.NOBLOCK)
                messages[kind] += 1
            except zmq.Again:
                messages["dropped"] += 1
            await asyncio.sleep(0.1)
    finally:
        sock.close(linger=0)
        context.term()
    return {
        "sent": samples,
        "control_samples": messages["oversized"],
        "attack_s": round(time.monotonic() - t0, 1),
        "messages": dict(messages),
        "endpoint": a.peer,
    }


def metadata_values(i: int) -> tuple[list[int], dict]:
    """The ``i``-th malformed metadata: a new value every request, in rotation of kinds."""
    kind = i % 6
    if kind == 0:
        custom: Any = {"program_id": f"bad\x07id-{i}", "is_last_step": True}
    elif kind == 1:
        custom = {"program_id": f"meta-rate-{i}", "is_last_step": f"perhaps-{i}"}
    elif kind == 2:
        custom = {"program_id": f"meta-rate-{i}", "tool_name": i, "is_last_step": True}
    elif kind == 3:
        custom = {"program_id": [i], "is_last_step": True}
    elif kind == 4:
        custom = {"program_id": "x" * 300 + str(i), "is_last_step": True}
    else:
        custom = {"program_id": f"meta-rate-{i}", "step": -i, "is_last_step": True}
    return [5 + i % 50, 6, 7, 8], _sp(1, custom)


async def atk_bad_metadata_rate(a: Attack) -> dict:
    n = a.s.hostile_metadata
    log0 = len(log_text(a.srv))
    out = await a.flood(metadata_values(i) for i in range(n))
    await asyncio.sleep(1.0)  # let the log reach the file
    added = log_text(a.srv)[log0:]
    lines = [ln for ln in added.splitlines() if "malformed" in ln]
    out.update(
        malformed_log_lines=len(lines),
        log_bytes_added=len(added.encode()),
        log_lines_per_malformed_request=round(len(lines) / max(1, out["sent"]), 4),
        log_sample=[ln[-160:] for ln in lines[:2]],
    )
    return out


ATTACKS: dict[str, Callable[[Attack], Awaitable[dict]]] = {
    "identical_prompts": atk_identical_prompts,
    "distinct_ids": atk_distinct_ids,
    "held_turns": atk_held_turns,
    "ending_others": atk_ending_others,
    "ending_others_unscoped": atk_ending_others,
    "tiny_programs": atk_tiny_programs,
    "peer_stats": atk_peer_stats,
    "bad_metadata_rate": atk_bad_metadata_rate,
}
