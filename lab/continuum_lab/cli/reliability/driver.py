"""The suite's driver: probe registry, sizes, the report, ``main``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from continuum_lab.cli.reliability.abort_storm import probe_abort_storm
from continuum_lab.cli.reliability.bad_metadata import probe_bad_metadata
from continuum_lab.cli.reliability.bad_stats import probe_bad_stats
from continuum_lab.cli.reliability.chaos import probe_chaos
from continuum_lab.cli.reliability.common import Ctx, ProbeResult
from continuum_lab.cli.reliability.flush_cache import probe_flush_cache
from continuum_lab.cli.reliability.hostile import PATTERNS as HOSTILE_PATTERNS
from continuum_lab.cli.reliability.hostile import probe_hostile
from continuum_lab.cli.reliability.many_programs import probe_many_programs
from continuum_lab.cli.reliability.oov_tokens import probe_oov_tokens
from continuum_lab.cli.reliability.pressure import probe_pressure
from continuum_lab.cli.reliability.sigkill_restart import probe_sigkill_restart
from continuum_lab.harness.server import SGLangServer

PROBES: dict[str, Callable[[Ctx], ProbeResult]] = {
    "bad_metadata": probe_bad_metadata,
    "oov_tokens": probe_oov_tokens,
    "flush_cache": probe_flush_cache,
    "abort_storm": probe_abort_storm,
    "sigkill_restart": probe_sigkill_restart,
    "bad_stats": probe_bad_stats,
    "many_programs": probe_many_programs,
    "pressure": probe_pressure,
    "chaos": probe_chaos,
    "hostile": probe_hostile,
}
# what runs when --probes is not given: ``hostile`` has a report page of its own
# (docs/results/hostile-traffic/) and runs only when named
DEFAULT_PROBES = tuple(p for p in PROBES if p != "hostile")

FULL = {
    "programs": 5_000,
    "storm_programs": 200,
    "kill_cycles": 2,
    "flush_programs": 8,
    "pressure_programs": 30,
    "pressure_turns": 9,
    "metadata_repeat": 10,
    "chaos_s": 120.0,
    "chaos_clients": 24,
    # hostile: attack sizes, then the honest traffic's windows (s)
    "hostile_identical": 20_000,
    "hostile_ids": 100_000,
    "hostile_held": 1_000,
    "hostile_endings": 300,
    "hostile_tiny": 5_000,
    "hostile_peer_s": 30.0,
    "hostile_metadata": 20_000,
    "hostile_baseline_s": 20.0,
    "hostile_min_s": 20.0,
    "hostile_hold_s": 30.0,
    "hostile_max_s": 120.0,
    "hostile_sample_s": 1.0,
    "hostile_baselines": "each",
    "hostile_settle_s": 60.0,
    "hostile_ttl": 10.0,
    "hostile_fcfs": "all",
}
QUICK = {
    "programs": 300,
    "storm_programs": 20,
    "kill_cycles": 1,
    "flush_programs": 4,
    "pressure_programs": 6,
    "pressure_turns": 3,
    "metadata_repeat": 5,
    "chaos_s": 20.0,
    "chaos_clients": 12,
    "many_max_s": 30.0,
    "pressure_max_s": 120.0,
    "kill_after_s": 3.0,
    "hostile_identical": 200,
    "hostile_ids": 64,
    "hostile_held": 32,
    "hostile_endings": 12,
    "hostile_tiny": 16,
    "hostile_peer_s": 1.0,
    "hostile_metadata": 120,
    "hostile_baseline_s": 1.5,
    "hostile_min_s": 1.0,
    "hostile_hold_s": 1.5,
    "hostile_max_s": 6.0,
    "hostile_sample_s": 0.5,
    "hostile_baselines": "once",
    "hostile_settle_s": 2.0,
    "hostile_ttl": 5.0,
    "hostile_fcfs": "none",  # the reference is the full run's: a second server costs the suite half a minute
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
    title = meta.get("title", "Reliability suite (issue 14)")
    lines = [f"# {title}", "", "```bash", *(r["command"] for r in runs), "```", ""]
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
    for r in results:  # a probe's own table (``details["report_md"]``: the hostile probe's patterns)
        if r.details.get("report_md"):
            lines += ["", f"## {r.probe}", "", r.details["report_md"]]
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
        # the package's docstring describes the suite (this module's, only the driver)
        description=(sys.modules[__package__].__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--probes",
        default=",".join(DEFAULT_PROBES),
        help=f"comma-separated subset of {','.join(PROBES)} (default: all but hostile)",
    )
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
    g.add_argument("--chaos-s", type=float, help="chaos: seconds of overload per seed")
    g.add_argument("--chaos-clients", type=int, help="chaos: concurrent agents")
    g.add_argument(
        "--chaos-seeds",
        type=lambda v: [int(x) for x in v.split(",") if x.strip()],
        help="chaos: comma-separated seeds, a fresh server each (default: --seed alone)",
    )
    g.add_argument("--chaos-fresh-max-s", type=float, default=10.0, help="chaos: a fresh program's first turn, at most")
    g.add_argument("--pressure-env", action="append", default=[], help="KEY=VALUE for the continuum server (a variant)")
    g.add_argument(
        "--pressure-seeds",
        type=lambda v: [int(x) for x in v.split(",") if x.strip()],
        help="pressure: comma-separated seeds, each a fcfs and a continuum run on fresh servers; the targets are "
        "judged on the median over seeds (default: --seed alone)",
    )
    g.add_argument("--pressure-programs", type=int)
    g.add_argument("--pressure-turns", type=int)
    g.add_argument("--pressure-first", type=int, default=400, help="first turn's prompt tokens (mean)")
    g.add_argument("--pressure-append", type=int, default=100, help="tokens each later turn appends (mean)")
    g.add_argument("--pressure-output", type=int, default=16)
    g.add_argument("--pressure-tool-s", type=float, default=1.0, help="mean tool time (lognormal, capped at 4 s)")
    g.add_argument("--pressure-jps", type=float, default=10.0, help="program arrivals per second")
    g.add_argument("--pressure-timeout", type=float, default=180.0, help="client timeout per request")
    g.add_argument("--pressure-max-s", type=float, default=420.0, help="cap on one policy's run")
    h = ap.add_argument_group("hostile: each hostile pattern beside honest agent traffic")
    h.add_argument("--hostile-patterns", default=",".join(HOSTILE_PATTERNS), help="comma-separated subset")
    h.add_argument("--hostile-identical", type=int, help="identical_prompts: id-less requests of one 128-token prompt")
    h.add_argument("--hostile-ids", type=int, help="distinct_ids: distinct program ids (one tiny turn each)")
    h.add_argument("--hostile-held", type=int, help="held_turns: first turns sent at once")
    h.add_argument("--hostile-hold-s", type=float, help="held_turns: how long they are left waiting, then aborted")
    h.add_argument("--hostile-endings", type=int, help="ending_others: actions against honest ids (10/s)")
    h.add_argument("--hostile-tiny", type=int, help="tiny_programs: 2-turn programs of a few tokens")
    h.add_argument("--hostile-peer-s", type=float, help="peer_stats: seconds of hostile peer messages")
    h.add_argument("--hostile-metadata", type=int, help="bad_metadata_rate: requests, each a new malformed value")
    h.add_argument("--hostile-baseline-s", type=float, help="the honest traffic alone, per baseline")
    h.add_argument("--hostile-min-s", type=float, help="least window the honest traffic is measured over per attack")
    h.add_argument("--hostile-max-s", type=float, help="cap on one attack's sending")
    h.add_argument("--hostile-settle-s", type=float, help="at most this long waiting for an empty queue per phase")
    h.add_argument("--hostile-sample-s", type=float, help="/metrics sampled this often during a phase")
    h.add_argument(
        "--hostile-baselines", choices=("each", "once"), help="a baseline before every pattern, or one at the start"
    )
    h.add_argument("--hostile-ttl", type=float, help="max_ttl_s, and the pins' TTL with --hostile-rules fixed")
    h.add_argument(
        "--hostile-rules",
        choices=("default", "fixed"),
        default="fixed",
        help="fixed: every non-final turn pinned --hostile-ttl s (pin losses show); default: the product's rules",
    )
    h.add_argument(
        "--hostile-fcfs",
        help="patterns also run against a stock fcfs server (the reference): all, none or a comma-separated subset "
        "(full: all; --quick: none)",
    )
    h.add_argument("--hostile-lanes", type=int, default=4, help="honest agents, each running programs back to back")
    h.add_argument("--hostile-batch", type=int, default=32, help="prompts per /generate of the floods")
    h.add_argument("--hostile-concurrency", type=int, default=4, help="concurrent attack requests of the floods")
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
        **({"title": "Hostile traffic beside agent programs"} if names == ["hostile"] else {}),
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
