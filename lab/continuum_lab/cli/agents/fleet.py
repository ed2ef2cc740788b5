"""Running every task against one server (or a fleet), and the CLI."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import httpx

from continuum_lab.cli.agents.report import _pct, score_attribution, summarize, write_report
from continuum_lab.cli.agents.tasks import IDENTITIES, AgentTask, TaskResult, load_tasks, run_task
from continuum_lab.harness.fleet import ROUTER_POLICIES, Fleet
from continuum_lab.harness.server import SGLangServer, parse_metrics


def _scrape(urls: list[str]) -> dict[str, float]:
    """Every series summed over the servers (the workers behind a router)."""
    try:
        return parse_metrics("\n".join(httpx.get(u + "/metrics", timeout=10).text for u in urls), prefix="sglang:")
    except httpx.HTTPError:
        return {}


def _pins_left(urls: list[str], wait_s: float = 10.0) -> float:
    """Pinned programs once the releases are handled (``/close_session`` is acknowledged first)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = _scrape(urls).get("sglang:continuum_pinned_programs", 0.0)
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def run_fleet(
    url: str,
    tasks: list[AgentTask],
    args,
    label: str,
    metrics_urls: Optional[list[str]] = None,
    *,
    plain: bool = False,
    attribution_log: Optional[Path] = None,
) -> dict:
    """Every task (x ``--repeat``) through ``url``; metrics from ``metrics_urls`` (default ``url``).
    ``plain``: stock mini-swe-agent, no program metadata; ``event_log``: the server's log
    of where it attributed each request with no id (scored when given)."""
    metrics_urls = metrics_urls or [url]
    before = _scrape(metrics_urls)
    run_id = f"{label}-{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="continuum-agents-") as tmp:
        jobs = [(task, f"{run_id}-{task.name}-{k}") for k in range(args.repeat) for task in tasks]
        lock = threading.Lock()
        done: list[TaskResult] = []

        def one(job):
            result = run_task(job[0], url, job[1], args, Path(tmp), plain=plain)
            with lock:
                done.append(result)
                print(
                    f"  [{label}] {result.task}: {result.exit_status} after {result.steps} steps, "
                    f"{result.jct_s:.1f} s ({len(done)}/{len(jobs)})",
                    flush=True,
                )
            return result

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            results = list(pool.map(one, jobs))
        makespan = time.monotonic() - t0
    # with ids every run is released (/close_session); a plain run's pins end by TTL: no wait
    pins_left = _pins_left(metrics_urls, wait_s=0.0 if plain else 10.0)
    after = _scrape(metrics_urls)
    delta = {
        k: after[k] - before.get(k, 0.0)
        for k in after
        if k.partition("{")[0].endswith(("_total", "_sum", "_count")) and after[k] != before.get(k, 0.0)
    }
    summary = summarize(results, delta, pins_left) | {"makespan_s": makespan}
    if attribution_log is not None:
        summary["attribution"] = score_attribution(results, attribution_log)
    identity = "plain" if plain else "ids"
    return {"label": label, "identity": identity, "url": url, "summary": summary, "tasks": [asdict(r) for r in results]}


def _identities(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in IDENTITIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"identities are {', '.join(IDENTITIES)} (comma-separated), not {text!r}")
    return names


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="continuum-agents", description="real mini-swe-agent programs against a server, one program per task"
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server (any policy)")
    where.add_argument("--model", help="start one CPU server per --policies with this model")
    ap.add_argument("--policies", default="fcfs,continuum", help="with --model")
    ap.add_argument("--server-args", default="", help="extra flags for every server started, quoted")
    ap.add_argument("--workers", type=int, default=1, help="with --model: this many workers behind smg")
    ap.add_argument("--router-policy", default="consistent_hashing", choices=ROUTER_POLICIES)
    ap.add_argument("--tasks", type=Path, default=Path("workloads/tasks"))
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="run every task this many times")
    ap.add_argument("--mode", choices=("text", "native"), default="text")
    ap.add_argument(
        "--grammar",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="force one command per step (extra_body.ebnf; a decoding constraint, no identity)",
    )
    ap.add_argument(
        "--identity",
        type=_identities,
        default=["ids"],
        help="ids (program ids sent three ways), plain (stock mini-swe-agent, nothing sent), or both: ids,plain "
        "(with --model, each on a fresh server; with --url, one after the other on the same server)",
    )
    ap.add_argument("--plain", dest="identity", action="store_const", const=["plain"], help="= --identity plain")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (greedy): every policy sees the same commands, so JCTs compare; the random model "
        "still varies its command with the history",
    )
    ap.add_argument("--step-limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160, help="per turn; the tiny tokenizer is ~1 token/char")
    ap.add_argument("--command-timeout-s", type=int, default=30)
    ap.add_argument("--model-name", default="tiny", help="the name sent to the OpenAI API")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    tasks = load_tasks(args.tasks)
    runs = []
    if args.url:
        for identity in args.identity:
            label = "server" if identity == "ids" else f"server-{identity}"
            runs.append(run_fleet(args.url.rstrip("/"), tasks, args, label, plain=identity == "plain"))
    else:
        flags = ["--enable-metrics", "--enable-cache-report", *args.server_args.split()]
        if args.mode == "native" and "--tool-call-parser" not in flags:
            flags += ["--tool-call-parser", "qwen25"]
        for policy, identity in ((p, i) for p in args.policies.split(",") for i in args.identity):
            plain = identity == "plain"
            name = policy if identity == "ids" else f"{policy}-{identity}"  # run label, file names
            log = attribution = None
            env: dict[str, str] = {}
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                log = args.out / f"server-{name}.log"
                if plain and policy.startswith("continuum") and args.workers == 1:
                    attribution = args.out / f"attribution-{name}.jsonl"
                    attribution.unlink(missing_ok=True)
                    env["SGLANG_CONTINUUM_EVENT_LOG"] = str(attribution.resolve())
            if args.workers > 1:
                logs = args.out / f"fleet-{name}" if args.out is not None else None
                if logs is not None:
                    logs.mkdir(parents=True, exist_ok=True)
                server_flags = ["--schedule-policy", policy, *flags]
                if "--max-total-tokens" not in flags:  # SGLang sizes each pool from free memory: N would not fit
                    server_flags += ["--max-total-tokens", "65536"]
                if "--served-model-name" not in flags:  # smg routes by model name; one server takes any
                    server_flags += ["--served-model-name", args.model_name]
                with Fleet(
                    args.model, server_flags, workers=args.workers, router_policy=args.router_policy, log_dir=logs
                ) as fleet:
                    label = f"{name}@{args.router_policy}"
                    runs.append(run_fleet(fleet.url, tasks, args, label, metrics_urls=fleet.worker_urls, plain=plain))
                continue
            with SGLangServer(args.model, ["--schedule-policy", policy, *flags], env=env, log_path=log) as server:
                runs.append(run_fleet(server.url, tasks, args, name, plain=plain, attribution_log=attribution))
    if args.out is not None:
        command = "continuum-agents " + shlex.join(argv if argv is not None else sys.argv[1:])
        write_report(args.out, runs, args, command)
        print(f"report: {args.out / 'report.md'}")
    for run in runs:
        s = run["summary"]
        by = s["requests_by_source"]
        a = s.get("attribution")
        print(
            f"{run['label']}: {s['ended']}/{s['tasks']} tasks ended, mean JCT {s['mean_jct_s']:.1f} s, "
            f"later-turn cached fraction {s['later_turn_cached_fraction']:.3f}, "
            f"pins {s['pins_created']:.0f} made / {s['pin_hits']:.0f} hit, pins left {s['pins_left_at_end']:.0f}, "
            f"requests by source {', '.join(f'{k} {v:.0f}' for k, v in by.items() if v)}"
            + (f", attribution recall {_pct(a['recall'])} precision {_pct(a['precision'])}" if a else "")
        )
    ok = all(r["summary"]["ended"] == r["summary"]["tasks"] for r in runs)
    return 0 if ok else 1
