"""Probe ``oov_tokens``."""

from __future__ import annotations

import time
from typing import Any

import httpx

from continuum_lab.cli.reliability.common import SHORT_ENV, Ctx, ProbeResult, finish, log_tail, quick_health, rnd
from continuum_lab.harness.server import SGLangServer


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
