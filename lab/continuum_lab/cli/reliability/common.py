"""What every probe shares: results, the server under test, HTTP helpers."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx

from continuum_lab.harness.server import SGLangServer, parse_metrics

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

E = "SGLANG_CONTINUUM_"


def short_lifetimes(ttl_s: float = 5, idle_timeout_s: float = 20, stats_save_interval_s: float = 30) -> dict[str, str]:
    """A continuum server's environment with a fixed TTL and short lifetimes (the lab's
    ``fixed_ttl`` rules), so that "back to empty" is reachable within a bounded wait. The rules
    require idle_timeout_s > ttl_s + 2 + 5 (the wait hold and the host TTL cap)."""
    rules = (
        f"continuum_lab.bench.variants:fixed_ttl(seconds={ttl_s!r}, program_idle_timeout_s={idle_timeout_s!r}, "
        f"max_wait_hold_s=2, max_host_ttl_s=5, stats_save_interval_s={stats_save_interval_s!r})"
    )
    return {E + "RULES": rules, E + "MAX_TTL_S": repr(ttl_s)}


SHORT_IDLE_S = 20.0
SHORT_ENV = short_lifetimes(idle_timeout_s=SHORT_IDLE_S)
TOOLS = ("bash", "grep", "python", "sed", "pytest")


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
