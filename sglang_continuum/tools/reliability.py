"""Reliability suite (issue 14): probe a live ``--schedule-policy continuum`` server as a skeptical
operator would, with bounded traffic on 127.0.0.1 only, one server at a time.

Probes (``--probes`` selects, in this order by default):

* ``bad_metadata``: malformed ``custom_params`` / ``session_id`` (wrong types, huge strings,
  control characters, nesting, non-object params) through ``/generate``, ``/v1/completions`` and
  ``/v1/chat/completions``: every answer must be a 200 or a clear 4xx, never a dead server; a
  program id carrying ``\\nFAKE LOG LINE`` must not forge a log line; malformed metadata is logged
  once per program and problem.
* ``oov_tokens``: out-of-vocabulary token ids (``[999999]``, ``[-1, 5]``, ...) must get a 4xx and
  leave the server alive (continuum, and fcfs unless ``--quick``).
* ``flush_cache``: live pins (fixed 60 s TTL) then ``/flush_cache``: pins and pool empty, every pin
  accounted for (created == hits + expiries + sheds + releases + flushed + live), the programs'
  next turns served.
* ``abort_storm``: many concurrent programs that time out client-side, close streams early, are
  aborted explicitly, or never send a last step: pins, pool and tracked programs back to empty.
* ``sigkill_restart``: SIGKILL the process group under load with a stats file saved every second;
  the file is valid every time and is loaded on restart.
* ``bad_stats``: a stats path that is a directory or unwritable, files of the wrong shape,
  truncated JSON, a save failing at run time; statistics saved at SIGTERM.
* ``many_programs``: many distinct program ids; scheduler RSS growth against an fcfs server; tracked
  programs back to 0 after the idle timeout.
* ``pressure``: 30 programs x 9 turns overflowing a 4,096-token pool, fcfs then continuum: failed
  requests, median and slowest request (target: 0 failed, slowest <= 1.5x fcfs's, median no worse).

"Pool empty" is read live from the scheduler (``/v1/loads``: tokens neither free nor evictable),
never after a ``/flush_cache`` (a flush frees every slot whatever holds it, so it would hide a
leak) and not from ``sglang:num_used_tokens`` (refreshed per batch, or every 30 s when idle).

Each probe reports sent / failed / healthy after / pins empty / pool empty / max wait / server died
into ``OUT/report.json`` and ``OUT/report.md``; server logs and stats files go to ``--logs`` (default:
a new folder under the temp dir, named in the report).

    continuum-reliability --out docs/results/reliability              # the full suite (~15 min, 2 cores)
    continuum-reliability --quick --probes bad_metadata,oov_tokens --out /tmp/rel
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import zlib
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import httpx

from sglang_continuum.core.admission_log import read_admission_log, summarize_admissions
from sglang_continuum.tools.server import SGLangServer, parse_metrics

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

E = "SGLANG_CONTINUUM_"
#: Short lifetimes so that "back to empty" is reachable within a bounded wait. The settings require
#: program_idle_timeout_s > max_ttl_s + max_wait_hold_s + max_host_ttl_s.
SHORT_ENV = {
    E + "TTL_MODEL": "fixed",
    E + "FIXED_TTL_S": "5",
    E + "MAX_TTL_S": "5",
    E + "MAX_WAIT_HOLD_S": "2",
    E + "MAX_HOST_TTL_S": "5",
    E + "PROGRAM_IDLE_TIMEOUT_S": "20",
}
TOOLS = ("bash", "grep", "python", "sed", "pytest")


# ----------------------------------------------------------------------------------------------
# results


@dataclass
class ProbeResult:
    probe: str
    sent: int = 0
    failed: int = 0
    healthy_after: Optional[bool] = None
    pins_empty: Optional[bool] = None  # None: not applicable (no continuum server left to ask)
    pool_empty: Optional[bool] = None
    max_wait_s: Optional[float] = None  # slowest request, client-observed (s)
    p50_s: Optional[float] = None
    p99_s: Optional[float] = None
    server_died: bool = False
    problems: list[str] = field(default_factory=list)  # expectations that did not hold
    notes: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        self.problems.append(text)

    @classmethod
    def from_dict(cls, d: dict) -> "ProbeResult":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        return {
            "probe": self.probe,
            "ok": self.ok,
            "sent": self.sent,
            "failed": self.failed,
            "healthy_after": self.healthy_after,
            "pins_empty": self.pins_empty,
            "pool_empty": self.pool_empty,
            "max_wait_s": self.max_wait_s,
            "p50_s": self.p50_s,
            "p99_s": self.p99_s,
            "server_died": self.server_died,
            "problems": self.problems,
            "notes": self.notes,
            "details": self.details,
            "wall_s": round(self.wall_s, 1),
        }


def quantile(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def rnd(x: Optional[float], nd: int = 2) -> Optional[float]:
    return None if x is None else round(x, nd)


# ----------------------------------------------------------------------------------------------
# context and server handling


@dataclass
class Ctx:
    model: str
    out: Path
    logs: Path
    sizes: argparse.Namespace
    quick: bool = False
    #: a running continuum server the probes use instead of starting their own (tests); started
    #: with ``SHORT_ENV``-like lifetimes. Probes that need another policy or environment still
    #: start their own.
    shared: Optional[SGLangServer] = None
    vocab: int = 0

    def __post_init__(self) -> None:
        if not self.vocab:
            try:
                self.vocab = int(json.loads((Path(self.model) / "config.json").read_text())["vocab_size"])
            except (OSError, ValueError, KeyError):
                self.vocab = 500

    def args(self, policy: str) -> list[str]:
        return [
            "--schedule-policy", policy, "--max-total-tokens", str(self.sizes.pool), "--enable-metrics",
            "--enable-cache-report", "--mem-fraction-static", "0.5",
        ]  # fmt: skip

    def new_server(self, name: str, policy: str = "continuum", env: Optional[dict] = None) -> SGLangServer:
        full = {E + "CHECK_INTEGRITY": "0" if self.sizes.no_integrity else "1", **(env or {})}
        return SGLangServer(self.model, self.args(policy), env=full, log_path=self.logs / f"{name}.log")

    @contextmanager
    def server(
        self, name: str, policy: str = "continuum", env: Optional[dict] = None, share: bool = True
    ) -> Iterator[SGLangServer]:
        """The shared server when there is one and ``share``, else a fresh one stopped afterwards."""
        if share and self.shared is not None and policy == "continuum":
            yield self.shared
            return
        srv = self.new_server(name, policy, env).start()
        try:
            yield srv
        finally:
            srv.stop()


def env_float(srv: SGLangServer, name: str, default: float) -> float:
    try:
        return float(srv.env.get(E + name, default))
    except ValueError:
        return default


def alive(srv: SGLangServer) -> bool:
    return srv.proc is not None and srv.proc.poll() is None


def healthy(srv: SGLangServer, timeout_s: float = 30.0) -> bool:
    """``/health_generate`` runs a one-token request through the scheduler (``/health`` alone
    only answers from the HTTP process)."""
    if not alive(srv):
        return False
    try:
        return httpx.get(srv.url + "/health_generate", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def quick_health(srv: SGLangServer) -> bool:
    """``/health`` (answered by the HTTP process) on a live process."""
    try:
        return alive(srv) and httpx.get(srv.url + "/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def continuum_gauges(srv: SGLangServer) -> dict[str, float]:
    try:
        return parse_metrics(srv.metrics())
    except (httpx.HTTPError, ValueError):
        return {}


def pool_used(srv: SGLangServer) -> Optional[int]:
    """Tokens of the KV pool neither free nor evictable, read live from the scheduler
    (``/v1/loads``); SGLang's ``sglang:num_used_tokens`` gauge is only refreshed per batch or
    every 30 s when idle, so it is only the fallback."""
    try:
        loads = httpx.get(srv.url + "/v1/loads", timeout=10).json()["loads"]
        return int(sum(load["num_used_tokens"] for load in loads))
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass
    try:
        m = parse_metrics(srv.metrics(), prefix="sglang:num_used_tokens")
        return int(m["sglang:num_used_tokens"]) if m else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def state(srv: SGLangServer) -> dict:
    g = continuum_gauges(srv)
    return {
        "alive": alive(srv),
        "pinned_programs": g.get("sglang:continuum_pinned_programs"),
        "pinned_tokens": g.get("sglang:continuum_pinned_tokens"),
        "tracked_programs": g.get("sglang:continuum_tracked_programs"),
        "used_tokens": pool_used(srv),
    }


def drain(srv: SGLangServer, timeout_s: float, *, tracked: bool = False, poll_s: float = 1.0) -> dict:
    """Wait (bounded) until pins, pool (and tracked programs) are back to empty."""
    t0 = time.monotonic()
    while True:
        st = state(srv)
        has_pins = st["pinned_programs"] is not None
        pins = (st["pinned_programs"] == 0 and st["pinned_tokens"] == 0) if has_pins else None
        pool = st["used_tokens"] == 0 if st["used_tokens"] is not None else False
        trk = (st["tracked_programs"] == 0) if (tracked and has_pins) else None
        done = st["alive"] and pins is not False and pool and trk is not False
        waited = time.monotonic() - t0
        if done or waited >= timeout_s or not st["alive"]:
            return {
                "pins_empty": pins,
                "pool_empty": pool if st["alive"] else None,
                "tracked_empty": trk,
                "drain_s": round(waited, 1),
                "final": st,
            }
        time.sleep(poll_s)


def finish(res: ProbeResult, srv: SGLangServer, *, drain_s: float, tracked: bool = False) -> None:
    """The common end of a probe: health, drain, death."""
    res.server_died = not alive(srv)
    if res.server_died:
        res.healthy_after = False
        res.problem(f"server died (exit {srv.proc.returncode if srv.proc else None})")
        res.notes.append("log tail: " + log_tail(srv, 3))
        return
    res.healthy_after = healthy(srv)
    d = drain(srv, drain_s, tracked=tracked)
    res.details["drain"] = d
    res.pins_empty, res.pool_empty = d["pins_empty"], d["pool_empty"]
    if not res.healthy_after:
        res.problem("not healthy after (/health_generate)")
    if res.pins_empty is False:
        res.problem(f"pins not empty after {drain_s:.0f}s: {d['final']}")
    if res.pool_empty is False:
        res.problem(f"pool not empty after {drain_s:.0f}s: used_tokens={d['final']['used_tokens']}")
    if d["tracked_empty"] is False:
        res.problem(f"tracked programs not 0 after {drain_s:.0f}s: {d['final']['tracked_programs']}")
    res.server_died = not alive(srv)


def log_text(srv: SGLangServer) -> str:
    try:
        return Path(srv.log_path).read_bytes().decode("utf-8", "replace") if srv.log_path else ""
    except OSError:
        return ""


def log_tail(srv: SGLangServer, n: int = 5) -> str:
    lines = [ln for ln in log_text(srv).splitlines() if ln.strip()]
    return " | ".join(ln[-200:] for ln in lines[-n:])


# ----------------------------------------------------------------------------------------------
# HTTP helpers


@dataclass
class Reply:
    status: Optional[int]  # None: transport error or client timeout
    latency: float
    body: Any = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def bad(self) -> bool:
        """What an operator must never see: a 5xx, a dropped connection, a hang."""
        return self.status is None or self.status >= 500


async def apost(
    client: httpx.AsyncClient, url: str, body: Any = None, *, raw: Optional[bytes] = None, timeout: float = 60.0
) -> Reply:
    t0 = time.perf_counter()
    try:
        if raw is not None:
            r = await client.post(url, content=raw, headers={"content-type": "application/json"}, timeout=timeout)
        else:
            r = await client.post(url, json=body, timeout=timeout)
        try:
            parsed = r.json()
        except ValueError:
            parsed = r.text[:300]
        return Reply(r.status_code, time.perf_counter() - t0, parsed)
    except httpx.HTTPError as exc:
        return Reply(None, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:200])


def gen_body(ids: list[int], max_new: int, custom: Optional[dict] = None, **extra) -> dict:
    sp: dict = {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0.0}
    if custom is not None:
        sp["custom_params"] = custom
    return {"input_ids": ids, "sampling_params": sp, **extra}


def rand_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(5, vocab) for _ in range(n)]


def limits(n: int) -> httpx.Limits:
    return httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)


def output_ids(body: Any, n: int) -> list[int]:
    ids = body.get("output_ids") if isinstance(body, dict) else None
    return list(ids)[:n] if ids else [9] * n


# ----------------------------------------------------------------------------------------------
# bad_metadata


def metadata_cases(marker: str) -> list[tuple[str, str, Any]]:
    """(name, path, body) -- bodies are JSON values, or ``bytes`` sent raw."""
    huge = "p" * 1_000_000
    base_text = "list the files then grep for the error"
    cases: list[tuple[str, str, Any]] = []

    def g(name: str, custom: Any = None, *, omit: bool = False, **top) -> None:
        sp: dict = {"max_new_tokens": 2, "ignore_eos": True}
        if not omit:
            sp["custom_params"] = custom
        cases.append(("generate/" + name, "/generate", {"text": base_text, "sampling_params": sp, **top}))

    g("no-custom-params", omit=True)
    g("null-custom-params", None)
    for name, pid in [
        ("int", 17), ("negative-int", -5), ("float", 1.5), ("bool", True), ("list", [1, 2]),
        ("dict", {"nested": {"deeper": [1, {"x": 2}]}}), ("empty", ""), ("spaces", "   "), ("257-chars", "x" * 257),
        ("1MB", huge), ("newline", "prog\nid"), ("esc", "prog\x1b[31mred"), ("nul", "prog\x00id"), ("cr", "prog\rid"),
        ("tab", "prog\tid"), ("rtl-override", "prog\u202eid"), ("unicode", "программа-程序-🚀"), ("big-int", 2**80),
        ("nan-string", "NaN"),
    ]:  # fmt: skip
        g("program_id-" + name, {"program_id": pid, "is_last_step": True})
    g("forged-log-line", {"program_id": f"evil\nFAKE LOG LINE {marker}", "is_last_step": True})
    g("forged-log-line-job_id", {"job_id": f"evil2\r\nFAKE LOG LINE {marker}", "last_step": True})
    for name, val in [
        ("string", "perhaps"), ("int-2", 2), ("list", []), ("dict", {}), ("null", None), ("string-true", "true"),
        ("huge", "y" * 100_000),
    ]:  # fmt: skip
        g("is_last_step-" + name, {"program_id": f"meta-last-{name}", "is_last_step": val})
    for name, val in [
        ("int", 12), ("list", ["bash"]), ("control", "ba\x1bsh\n"), ("huge", "t" * 100_000), ("empty", ""),
    ]:  # fmt: skip
        g("tool_name-" + name, {"program_id": f"meta-tool-{name}", "tool_name": val, "is_last_step": True})
    for name, val in [("list", [{"program_id": "x"}]), ("string", "program_id=x"), ("int", 3), ("true", True)]:
        g("custom_params-" + name, val)
    many_keys = {**{f"k{i}": i for i in range(10_000)}, "program_id": "meta-keys", "is_last_step": True}
    g("custom_params-10000-keys", many_keys)
    g("custom_params-nested-100", json.loads('{"a":' * 100 + "1" + "}" * 100))
    for name, sid in [
        ("dict", {"id": "x"}), ("list", ["x"]), ("int", 5), ("newline", "sess\nFAKE"), ("huge", "s" * 100_000),
    ]:  # fmt: skip
        g("session_id-" + name, {"is_last_step": True}, session_id=sid)
    # nesting deep enough to hit JSON parsers' recursion limits, sent raw
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    raw = b'{"text": "x", "sampling_params": {"max_new_tokens": 1, "custom_params": ' + deep + b"}}"
    cases.append(("generate/custom_params-nested-5000-raw", "/generate", raw))
    cases.append(("generate/not-json", "/generate", b'{"text": "x", "sampling_params": {'))

    msgs = [{"role": "user", "content": base_text}]

    def c(name: str, custom: Any, **top) -> None:
        body = {"model": "m", "messages": msgs, "max_tokens": 2, "custom_params": custom, **top}
        cases.append(("chat/" + name, "/v1/chat/completions", body))

    c("valid", {"program_id": "meta-chat-ok", "is_last_step": True})
    c("program_id-dict", {"program_id": {"a": 1}, "is_last_step": "perhaps"})
    c("program_id-control", {"program_id": "chat\x00\x1b\n", "tool_name": 5})
    c("program_id-1MB", {"program_id": huge})
    c("custom_params-list", [1, 2, 3])
    c("custom_params-string", "program_id")
    c("custom_params-nested", {"program_id": [[[[{"x": [1]}]]]], "is_last_step": {"a": [1]}})
    c("session_id-dict", {"is_last_step": True}, session_id={"id": 1})
    c("session_id-control", {"is_last_step": True}, session_id="s\x1b[2J")
    for name, custom in [("program_id-list", {"program_id": [1]}), ("custom_params-int", 7)]:
        body = {"model": "m", "prompt": base_text, "max_tokens": 2, "custom_params": custom}
        cases.append(("completions/" + name, "/v1/completions", body))
    return cases


def probe_bad_metadata(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("bad_metadata")
    marker = uuid.uuid4().hex[:12]
    cases = metadata_cases(marker)
    repeat = ctx.sizes.metadata_repeat
    with ctx.server("bad_metadata", env=SHORT_ENV) as srv:
        log_start = len(log_text(srv))

        async def run() -> list[tuple[str, Reply]]:
            out = []
            async with httpx.AsyncClient() as client:
                for name, path, body in cases:
                    raw = body if isinstance(body, bytes) else None
                    out.append((name, await apost(client, srv.url + path, None if raw else body, raw=raw)))
                    if not alive(srv):
                        break
                # the same malformed metadata, repeated: logged once per program and problem
                custom = {"program_id": f"meta-repeat-{marker}", "is_last_step": "perhaps"}
                for _ in range(repeat):
                    body = {"text": "again", "sampling_params": {"max_new_tokens": 1, "custom_params": custom}}
                    out.append(("repeat/is_last_step-perhaps", await apost(client, srv.url + "/generate", body)))
            return out

        replies = asyncio.run(run())
        res.sent = len(replies)
        statuses: Counter = Counter()
        for name, r in replies:
            statuses[str(r.status) if r.status is not None else "error"] += 1
            if r.bad:
                res.failed += 1
                res.notes.append(f"{name}: {r.status or r.error}")
        res.details["statuses"] = dict(statuses)
        res.details["per_case"] = {n: r.status if r.status is not None else r.error for n, r in replies}
        lat = [r.latency for _, r in replies]
        res.max_wait_s, res.p50_s, res.p99_s = rnd(max(lat)), rnd(quantile(lat, 0.5), 3), rnd(quantile(lat, 0.99), 3)
        time.sleep(1.0)  # let the log reach the file
        log = log_text(srv)[log_start:]
        forged = [ln for ln in log.splitlines() if ln.lstrip().startswith(f"FAKE LOG LINE {marker}")]
        repeat_lines = [ln for ln in log.splitlines() if f"meta-repeat-{marker}" in ln]
        res.details.update(
            forged_log_lines_at_line_start=len(forged),
            marker_mentions=log.count(marker),
            raw_esc_in_log=log.count("\x1b"),
            raw_nul_in_log=log.count("\x00"),
            repeat_warning_lines=len(repeat_lines),
        )
        if forged:
            res.problem(f"a program id forged {len(forged)} log line(s) at line start")
        if res.details["raw_esc_in_log"] or res.details["raw_nul_in_log"]:
            res.problem("raw ESC/NUL from request metadata reached the log")
        if len(repeat_lines) > 1:
            res.problem(f"the same malformed metadata was logged {len(repeat_lines)} times (expected once)")
        if res.failed:
            res.problem(f"{res.failed} request(s) got a 5xx or no answer")
        res.notes.insert(0, "statuses " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
        res.notes.append(
            f"forged lines at line start: {len(forged)}; raw ESC/NUL in log: {res.details['raw_esc_in_log']}/"
            f"{res.details['raw_nul_in_log']}; repeated malformed metadata logged {len(repeat_lines)}x for "
            f"{repeat} requests"
        )
        finish(res, srv, drain_s=15 + env_float(srv, "MAX_TTL_S", 30))
    return res


# ----------------------------------------------------------------------------------------------
# oov_tokens


def oov_cases(vocab: int) -> list[tuple[str, str, Any, bool]]:
    """(name, path, body, should_be_accepted)"""
    sp = {"max_new_tokens": 2, "ignore_eos": True}
    gen = lambda ids: {"input_ids": ids, "sampling_params": sp}
    comp = lambda ids: {"model": "m", "prompt": ids, "max_tokens": 2}
    return [
        ("input_ids=[999999]", "/generate", gen([999999]), False),
        ("input_ids=[-1,5]", "/generate", gen([-1, 5]), False),
        (f"input_ids=[vocab={vocab}]", "/generate", gen([vocab]), False),
        ("input_ids=[2**63]", "/generate", gen([2**63]), False),
        ("input_ids=[1.5,3]", "/generate", gen([1.5, 3]), False),
        ("input_ids=['a']", "/generate", gen(["a"]), False),
        ("batch [[5,6],[999999]]", "/generate", gen([[5, 6], [999999]]), False),
        ("completions prompt=[999999]", "/v1/completions", comp([999999]), False),
        ("completions prompt=[-1]", "/v1/completions", comp([-1]), False),
        (f"input_ids=[5,{vocab - 1}] (valid edge)", "/generate", gen([5, vocab - 1]), True),
    ]


def _oov_run(srv: SGLangServer, vocab: int) -> dict:
    rows, died_at, lat = {}, None, []
    with httpx.Client() as client:
        for name, path, body, accept in oov_cases(vocab):
            t0 = time.perf_counter()
            try:
                r = client.post(srv.url + path, json=body, timeout=60)
                status, text = r.status_code, r.text[:160]
            except httpx.HTTPError as exc:
                status, text = None, type(exc).__name__
            lat.append(time.perf_counter() - t0)
            time.sleep(0.5)  # a crashed scheduler takes the launcher down within a moment
            up = quick_health(srv)
            want = (status == 200) if accept else (status is not None and 400 <= status < 500)
            rows[name] = {"status": status, "as_expected": want, "alive_after": up, "answer": text}
            if not up:
                died_at = name
                break
    return {"cases": rows, "died_at": died_at, "lat": lat}


def probe_oov_tokens(ctx: Ctx) -> ProbeResult:
    """The verdict is continuum's; the same cases against fcfs (not with ``--quick``) show what
    stock SGLang does with them (issue 14: an upstream crash)."""
    res = ProbeResult("oov_tokens")
    per_policy = {}
    with ctx.server("oov_tokens-continuum", env=SHORT_ENV) as srv:
        run = per_policy["continuum"] = _oov_run(srv, ctx.vocab)
        rows = run["cases"]
        res.sent = len(rows)
        res.failed = sum(1 for v in rows.values() if not v["as_expected"] or not v["alive_after"])
        res.max_wait_s = rnd(max(run.pop("lat")))
        if run["died_at"]:
            res.problem(f"server died on {run['died_at']}")
            res.notes.append(f"continuum: died on {run['died_at']}; log: {log_tail(srv, 2)}")
        else:
            res.notes.append("continuum: " + ", ".join(f"{k}->{v['status']}" for k, v in rows.items()))
        wrong = [k for k, v in rows.items() if not v["as_expected"]]
        if wrong:
            res.problem(f"unexpected answer (5xx, no answer, or accepted) for {', '.join(wrong)}")
        finish(res, srv, drain_s=15)
    if not ctx.quick:
        with ctx.server("oov_tokens-fcfs", policy="fcfs") as srv:
            run = per_policy["fcfs"] = _oov_run(srv, ctx.vocab)
            run.pop("lat")
            if run["died_at"]:
                res.notes.append(f"upstream (fcfs, for comparison): the server died on {run['died_at']}")
            else:
                res.notes.append("fcfs: " + ", ".join(f"{k}->{v['status']}" for k, v in run["cases"].items()))
    res.details["per_policy"] = per_policy
    return res


# ----------------------------------------------------------------------------------------------
# flush_cache

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
    env = {
        **SHORT_ENV,
        E + "FIXED_TTL_S": "60",
        E + "MAX_TTL_S": "60",
        E + "MAX_WAIT_HOLD_S": "2",
        E + "MAX_HOST_TTL_S": "5",
        E + "PROGRAM_IDLE_TIMEOUT_S": "90",
    }
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


# ----------------------------------------------------------------------------------------------
# abort_storm

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
        idle = env_float(srv, "PROGRAM_IDLE_TIMEOUT_S", 900)
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


# ----------------------------------------------------------------------------------------------
# sigkill_restart (and the agent traffic bad_stats uses)


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
        interval = "3600" if last else "1"
        env = {**SHORT_ENV, E + "STATS_PATH": str(path), E + "STATS_SAVE_INTERVAL_S": interval}
        row: dict = {"cycle": cycle, "save_interval_s": float(interval)}
        per_cycle.append(row)
        if cycle == 0 and first is not None:
            srv, ctx.shared = first, None
            row["save_interval_s"] = env_float(srv, "STATS_SAVE_INTERVAL_S", 30)
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


# ----------------------------------------------------------------------------------------------
# bad_stats


def _bad_stats_case(
    ctx: Ctx,
    name: str,
    path: Path,
    *,
    interval: float,
    expect_start: bool,
    runtime_dir: bool = False,
    sigterm_check: bool = False,
) -> dict:
    env = {**SHORT_ENV, E + "STATS_PATH": str(path), E + "STATS_SAVE_INTERVAL_S": str(interval)}
    srv = ctx.new_server(f"bad_stats-{len(name)}-{zlib.crc32(name.encode()):08x}", env=env)
    row: dict = {"case": name, "path": str(path), "log": str(srv.log_path), "problems": [], "sent": 0, "failed": 0}
    t0 = time.monotonic()
    try:
        srv.start()
        row["started"] = True
    except (RuntimeError, TimeoutError) as exc:
        row["started"] = False
        row["start_s"] = round(time.monotonic() - t0, 1)
        row["refused_clearly"] = "stats_path" in log_text(srv)
        row["log_tail"] = log_tail(srv, 2)
        if expect_start:
            row["problems"].append(f"did not start ({exc}); {row['log_tail']}")
        elif not row["refused_clearly"]:
            row["problems"].append("refused to start without naming stats_path")
        srv.stop()
        return row
    try:
        row["load_report"] = next(
            (
                ln.split("continuum:", 1)[-1].strip()[:160]
                for ln in log_text(srv).splitlines()
                if "tool statistics" in ln
            ),
            None,
        )
        stats: dict = {"sent": 0, "failed": 0, "killed": 0, "lat": [], "errors": []}

        wait = max(2.5 * interval, 3.0) if interval < 60 else 4.0
        asyncio.run(_traffic(ctx, srv, wait, stats, min_requests=6 if sigterm_check else 0))
        row["up_after_s"] = round(wait, 1)
        row["stayed_up"] = alive(srv) and healthy(srv, 20)
        if not row["stayed_up"]:
            row["problems"].append(f"died within {wait:.0f}s ({log_tail(srv, 2)})")
        if interval < 60 and row["stayed_up"]:  # the periodic save replaced the bad file
            row["file_after_saves"] = read_stats_file(path)
            if not row["file_after_saves"]["schema_ok"]:
                row["problems"].append(f"no valid save replaced the file: {row['file_after_saves']}")
        if runtime_dir and row["stayed_up"]:  # the path becomes a directory while serving
            if path.is_file():
                path.unlink()
            path.mkdir(exist_ok=True)
            asyncio.run(_traffic(ctx, srv, max(3 * interval, 3.0), stats))
            g = continuum_gauges(srv)
            row["runtime_dir"] = {
                "alive": alive(srv) and healthy(srv, 20),
                "save_failures": g.get("sglang:continuum_stats_save_failures_total"),
                "saves": g.get("sglang:continuum_stats_saves_total"),
            }
            if not row["runtime_dir"]["alive"]:
                row["problems"].append(f"a save failing at run time killed the server ({log_tail(srv, 2)})")
            elif not row["runtime_dir"]["save_failures"]:
                row["problems"].append("a save failing at run time was not counted in stats_save_failures_total")
        row["sent"], row["failed"] = stats["sent"], stats["failed"]
        if stats["failed"]:
            row["problems"].append(f"{stats['failed']} request(s) failed: {stats['errors'][:2]}")
        row["max_latency_s"] = rnd(max(stats["lat"], default=None))
        if alive(srv):
            d = drain(srv, 10)
            row["pins_empty"], row["pool_empty"] = d["pins_empty"], d["pool_empty"]
    finally:
        was_alive = alive(srv)
        row["sigterm_to"] = "launcher" if sigterm_check else "process group"
        row["sigterm_exit_s"] = sigterm(srv, group=not sigterm_check)
        if was_alive and row["sigterm_exit_s"] is None:
            row["problems"].append("still running 30s after SIGTERM")
        srv.stop()
    if runtime_dir and path.is_dir():
        path.rmdir()
    if sigterm_check:
        f = row["file_after_sigterm"] = read_stats_file(path)
        if not (f["schema_ok"] and f["samples"] > 0):
            row["problems"].append(f"statistics not saved at SIGTERM: {f}")
    return row


def probe_bad_stats(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("bad_stats")
    d = ctx.logs / "bad_stats"
    d.mkdir(parents=True, exist_ok=True)
    rows = []

    def fresh(name: str, content: Optional[str] = None) -> Path:
        p = d / name
        if p.is_dir():
            p.rmdir()
        p.unlink(missing_ok=True)
        if content is not None:
            p.write_text(content)
        return p

    if not ctx.quick:
        dir_path = d / "a-directory"
        dir_path.mkdir(exist_ok=True)
        rows.append(_bad_stats_case(ctx, "a directory", dir_path, interval=1, expect_start=False))
        not_dir = fresh("a-file", "x")
        unwritable = not_dir / "stats.json"  # as root nothing else is unwritable
        rows.append(_bad_stats_case(ctx, "unwritable (parent is a file)", unwritable, interval=1, expect_start=False))
    list_file = fresh("list.json", '{"tool_stats": []}')
    name = 'wrong shape {"tool_stats": []}, then a directory at run time'
    rows.append(_bad_stats_case(ctx, name, list_file, interval=1, expect_start=True, runtime_dir=True))
    if not ctx.quick:
        signals = fresh("signals.json", '{"tool_stats": {"version": 1}, "signals": []}')
        rows.append(_bad_stats_case(ctx, 'wrong shape "signals": []', signals, interval=1, expect_start=True))
    truncated = fresh("truncated.json", '{"tool_stats": {"version": 1, "tools": {"bash": [0.5, 0.7, 1.')
    name = "truncated JSON, then SIGTERM to the launcher (save interval 1 h)"
    rows.append(_bad_stats_case(ctx, name, truncated, interval=3600, expect_start=True, sigterm_check=True))
    for row in rows:
        res.sent += row["sent"]
        res.failed += row["failed"]
        for p in row["problems"]:
            res.problem(f"{row['case']}: {p}")
        what = (
            "started" if row["started"] else ("refused, naming stats_path" if row.get("refused_clearly") else "refused")
        )
        extra = []
        if row.get("stayed_up") is not None:
            extra.append(f"up {row['up_after_s']}s: {row['stayed_up']}")
        if "file_after_saves" in row:
            extra.append(f"file replaced by a valid save: {row['file_after_saves']['schema_ok']}")
        if "runtime_dir" in row:
            rd = row["runtime_dir"]
            extra.append(f"dir at run time: alive {rd['alive']}, save failures counted {rd['save_failures']}")
        if "file_after_sigterm" in row:
            f = row["file_after_sigterm"]
            extra.append(f"saved at SIGTERM: {f['schema_ok']} ({f['samples']} samples)")
        if row.get("sigterm_exit_s") is not None:
            extra.append(f"exit {row['sigterm_exit_s']}s after SIGTERM to the {row['sigterm_to']}")
        res.notes.append(f"{row['case']}: {what}" + (f" ({'; '.join(extra)})" if extra else ""))
    res.details["cases"] = rows
    started = [r for r in rows if r["started"]]
    res.healthy_after = all(r.get("stayed_up", False) for r in started) if started else None
    res.pins_empty = all(r.get("pins_empty") is not False for r in started) if started else None
    res.pool_empty = all(r.get("pool_empty") is not False for r in started) if started else None
    res.max_wait_s = max((r["max_latency_s"] for r in started if r.get("max_latency_s") is not None), default=None)
    res.server_died = any(
        r.get("stayed_up") is False or r.get("runtime_dir", {}).get("alive") is False for r in started
    )
    return res


# ----------------------------------------------------------------------------------------------
# many_programs


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
    env = {**SHORT_ENV, E + "PROGRAM_IDLE_TIMEOUT_S": str(ctx.sizes.idle_timeout)}
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


# ----------------------------------------------------------------------------------------------
# pressure


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


# ----------------------------------------------------------------------------------------------
# driver and report

PROBES: dict[str, Callable[[Ctx], ProbeResult]] = {
    "bad_metadata": probe_bad_metadata,
    "oov_tokens": probe_oov_tokens,
    "flush_cache": probe_flush_cache,
    "abort_storm": probe_abort_storm,
    "sigkill_restart": probe_sigkill_restart,
    "bad_stats": probe_bad_stats,
    "many_programs": probe_many_programs,
    "pressure": probe_pressure,
}

FULL = {
    "programs": 5_000,
    "storm_programs": 200,
    "kill_cycles": 2,
    "flush_programs": 8,
    "pressure_programs": 30,
    "pressure_turns": 9,
    "metadata_repeat": 10,
}
QUICK = {
    "programs": 300,
    "storm_programs": 20,
    "kill_cycles": 1,
    "flush_programs": 4,
    "pressure_programs": 6,
    "pressure_turns": 3,
    "metadata_repeat": 5,
    "many_max_s": 30.0,
    "pressure_max_s": 120.0,
    "kill_after_s": 3.0,
}


def run_probe(ctx: Ctx, name: str) -> ProbeResult:
    t0 = time.monotonic()
    try:
        res = PROBES[name](ctx)
    except Exception as exc:  # a probe that crashes is itself a finding; the suite goes on
        res = ProbeResult(name)
        res.problem(f"probe crashed: {type(exc).__name__}: {exc}"[:500])
        res.details["traceback"] = traceback.format_exc()[-3000:]
    res.wall_s = time.monotonic() - t0
    return res


def fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def write_report(out: Path, results: list[ProbeResult], runs: list[dict], meta: dict) -> None:
    """``runs``: each run that produced these results: {command, started, git, probes}."""
    out.mkdir(parents=True, exist_ok=True)
    report = {"runs": runs, **meta, "probes": [r.to_dict() for r in results]}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = ["# Reliability suite (issue 14)", "", "```bash", *(r["command"] for r in runs), "```", ""]
    if len(runs) > 1:
        lines += ["Probes re-run by a later command (`--merge`) replace the earlier results:", ""]
        lines += [f"- {r['started']}, git {r['git']}: {', '.join(r['probes'])}" for r in runs]
        lines.append("")
    else:
        lines += [f"{runs[0]['started']}, git {runs[0]['git']}.", ""]
    lines += [
        f"{meta['machine']}; pool {meta['sizes']['pool']} tokens, tiny model on CPU, one server at a time on 127.0.0.1.",
        "",
        "`max wait` = slowest request, client-observed (s). `pool empty` = no KV slot neither free nor evictable "
        "(`/v1/loads`). `ok` = every expectation of the probe held (see Problems).",
        "",
        "| probe | ok | sent | failed | healthy after | pins empty | pool empty | max wait (s) | server died | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        notes = "; ".join(r.notes).replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r.probe} | {fmt(r.ok)} | {r.sent} | {r.failed} | {fmt(r.healthy_after)} | {fmt(r.pins_empty)} | "
            f"{fmt(r.pool_empty)} | {fmt(r.max_wait_s)} | {'**yes**' if r.server_died else 'no'} | {notes} |"
        )
    lines += ["", "## Problems", ""]
    for r in results:
        lines += [f"- **{r.probe}**: {p}".replace("\n", " ") for p in r.problems]
    if all(r.ok for r in results):
        lines.append("None.")
    lines += ["", "## Wall time per probe", ""] + [f"- {r.probe}: {r.wall_s:.0f} s" for r in results]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def git_rev() -> str:
    try:
        run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, timeout=10).stdout.strip()
        return run("rev-parse", "--short", "HEAD") + ("+dirty" if run("status", "--porcelain", "-uno") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="continuum-reliability",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated subset of {','.join(PROBES)}")
    ap.add_argument("--out", type=Path, default=Path("docs/results/reliability"))
    ap.add_argument(
        "--logs", type=Path, default=None, help="server logs and stats files (default: a new folder under the temp dir)"
    )
    ap.add_argument("--model", default=".models/tiny-llama")
    ap.add_argument("--quick", action="store_true", help="small sizes (tests): a few minutes in all")
    ap.add_argument("--pool", type=int, default=4096, help="--max-total-tokens of every server")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-integrity", action="store_true", help="do not run the servers with check_integrity")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep OUT/report.json's results of the probes not run now (re-run one probe after a fix)",
    )
    g = ap.add_argument_group("sizes (defaults: the full suite; --quick shrinks those not given)")
    g.add_argument("--metadata-repeat", type=int, help="the same malformed metadata sent this often (logged once?)")
    g.add_argument("--programs", type=int, help="many_programs: distinct program ids")
    g.add_argument("--many-concurrency", type=int, default=32)
    g.add_argument("--many-max-s", type=float, default=60.0, help="many_programs: traffic time cap per server")
    g.add_argument(
        "--max-bytes-per-program",
        type=int,
        default=4096,
        help="many_programs: scheduler memory per program beyond fcfs above which it is a problem",
    )
    g.add_argument("--idle-timeout", type=float, default=20.0, help="many_programs: program_idle_timeout_s")
    g.add_argument("--storm-programs", type=int)
    g.add_argument("--storm-max-s", type=float, default=300.0)
    g.add_argument("--kill-cycles", type=int)
    g.add_argument("--kill-after-s", type=float, default=5.0, help="load before each SIGKILL")
    g.add_argument("--kill-agents", type=int, default=4)
    g.add_argument(
        "--kill-initial", default="", help="content of the stats file at the first start (e.g. a wrong shape)"
    )
    g.add_argument("--flush-programs", type=int)
    g.add_argument("--pressure-env", action="append", default=[], help="KEY=VALUE for the continuum server (a variant)")
    g.add_argument("--pressure-programs", type=int)
    g.add_argument("--pressure-turns", type=int)
    g.add_argument("--pressure-first", type=int, default=400, help="first turn's prompt tokens (mean)")
    g.add_argument("--pressure-append", type=int, default=100, help="tokens each later turn appends (mean)")
    g.add_argument("--pressure-output", type=int, default=16)
    g.add_argument("--pressure-tool-s", type=float, default=1.0, help="mean tool time (lognormal, capped at 4 s)")
    g.add_argument("--pressure-jps", type=float, default=10.0, help="program arrivals per second")
    g.add_argument("--pressure-timeout", type=float, default=180.0, help="client timeout per request")
    g.add_argument("--pressure-max-s", type=float, default=420.0, help="cap on one policy's run")
    g.add_argument(
        "--median-tolerance",
        type=float,
        default=1.05,
        help="continuum/fcfs median ratio that still counts as no worse (so does a difference under 0.1 s)",
    )
    return ap


def resolve_sizes(args: argparse.Namespace) -> argparse.Namespace:
    preset = QUICK if args.quick else {}
    for key, full in FULL.items():
        if getattr(args, key) is None:
            setattr(args, key, preset.get(key, full))
    if args.quick:
        defaults = build_parser()
        for key in ("many_max_s", "pressure_max_s", "kill_after_s"):
            if getattr(args, key) == defaults.get_default(key):
                setattr(args, key, QUICK[key])
    return args


def make_ctx(argv: Optional[list[str]] = None, *, shared: Optional[SGLangServer] = None) -> Ctx:
    args = resolve_sizes(build_parser().parse_args(argv))
    logs = args.logs or Path(tempfile.mkdtemp(prefix="continuum-reliability-"))
    logs.mkdir(parents=True, exist_ok=True)
    return Ctx(model=args.model, out=args.out, logs=logs, sizes=args, quick=args.quick, shared=shared)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ctx = make_ctx(argv)
    args = ctx.sizes
    names = [p.strip() for p in args.probes.split(",") if p.strip()]
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        print(f"unknown probe(s) {unknown}; choose from {list(PROBES)}", file=sys.stderr)
        return 2
    # scripts/reliability.sh names itself (its --out comes first: the caller's --out wins)
    command = os.environ.get("CONTINUUM_RELIABILITY_COMMAND") or "continuum-reliability " + shlex.join(argv)
    run = {"command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_rev(), "probes": names}
    meta = {
        "machine": f"{os.cpu_count()} cores, {platform.platform()}",
        "logs": str(ctx.logs),
        "sizes": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
    }
    runs, kept = [run], {}
    previous = args.out / "report.json"
    if args.merge and previous.is_file():
        old = json.loads(previous.read_text())
        runs = [*old.get("runs", []), run]
        kept = {p["probe"]: ProbeResult.from_dict(p) for p in old["probes"] if p["probe"] not in names}
    results: list[ProbeResult] = []

    def ordered() -> list[ProbeResult]:
        done = {r.probe: r for r in [*kept.values(), *results]}
        return [done[p] for p in PROBES if p in done]

    for name in names:
        print(f"[reliability] {name} ...", flush=True)
        res = run_probe(ctx, name)
        results.append(res)
        status = "ok" if res.ok else "PROBLEMS"
        print(
            f"[reliability] {name}: {status} in {res.wall_s:.0f}s; sent {res.sent}, failed {res.failed}, "
            f"died {res.server_died}" + "".join(f"\n    - {p}" for p in res.problems),
            flush=True,
        )
        write_report(args.out, ordered(), runs, meta)  # partial reports survive an interrupted run
    print(f"[reliability] report: {args.out / 'report.md'}")
    return 0 if all(r.ok for r in ordered()) else 1


if __name__ == "__main__":
    sys.exit(main())
