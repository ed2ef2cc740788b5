"""Probe ``bad_metadata``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from typing import Any

import httpx

from continuum_lab.cli.reliability.common import (
    SHORT_ENV,
    Ctx,
    E,
    ProbeResult,
    Reply,
    alive,
    apost,
    finish,
    log_text,
    quantile,
    rnd,
)


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
                # the same malformed metadata, repeated: logged once per program and problem at most
                # (malformed metadata logs a bounded number of lines a minute in all)
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
        finish(res, srv, drain_s=15 + float(srv.env.get(E + "MAX_TTL_S", 30)))
    return res
