"""Probe ``bad_stats``."""

from __future__ import annotations

import asyncio
import time
import zlib
from pathlib import Path
from typing import Optional

from continuum_lab.cli.reliability.common import (
    SHORT_IDLE_S,
    Ctx,
    E,
    ProbeResult,
    alive,
    continuum_gauges,
    drain,
    healthy,
    log_tail,
    log_text,
    rnd,
    short_lifetimes,
)
from continuum_lab.cli.reliability.sigkill_restart import _traffic, read_stats_file, sigterm


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
    env = {**short_lifetimes(idle_timeout_s=SHORT_IDLE_S, stats_save_interval_s=interval), E + "STATS_PATH": str(path)}
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
