"""``continuum-aiperf``: the field's benchmark, NVIDIA's AIPerf, driving fcfs / lpm / continuum servers.

    bash scripts/setup-aiperf.sh      # .venv-aiperf: aiperf==0.13.0 (its own venv, Python 3.11)
    continuum-aiperf --model .models/tiny-llama --policies fcfs,lpm,continuum --seeds 1,2,3 \\
        --sessions 16 --window-s 90 --warmup-s 30 --pool-programs 3 --out out/aiperf

For each seed and each policy, interleaved seed-major (seed 1: fcfs, lpm, continuum; seed 2: ...),
a fresh server with ``continuum-bench``'s flags (the KV pool holds ``--pool-programs`` average
contexts of the trace; the policy's flags and plugin settings; the CPU prefill profile), then
``aiperf profile`` against it with the trace (``harness/aiperf.py``: ``--concurrency`` sessions
in flight, a warm-up phase, a measured phase of ``--window-s``), then the server stopped. Each run
keeps AIPerf's own exports (``OUT/aiperf-POLICY-sSEED/``) and the server's ``/metrics`` over
AIPerf's measured phase; ``report.json`` and ``report.md`` give AIPerf's figures beside the
server's, per policy the median, the spread and the worst seed, and continuum against the best
stock policy (``bench/aiperf_report.py``). The report is rewritten after every run.

The trace (``--trace``): a multi-turn ``mooncake_trace`` file is used as it is (the default is the
CPU-scaled Claude Code corpus, ``workloads/aiperf/``); a workload JSONL or kv-cache-tester
``.json`` traces are converted first (``workloads/mooncake_trace.py``), with ``--token-scale`` and
``--programs``, into ``OUT/trace.mooncake.jsonl``. ``--url`` drives an already running server
instead (one policy, the label of that server; its cache flushed before each seed): on a GPU host
with a real model, ``--model`` then names what AIPerf asks for and tokenises with.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import httpx
import orjson

from continuum_lab.bench import aiperf_report
from continuum_lab.bench.policies import CPU_PROFILE, context_length, parse_policy, pool_regime, pressure_pool_tokens
from continuum_lab.harness.aiperf import (
    AIPERF_VENV,
    IDENTITIES,
    AIPerfRun,
    MetricsWatch,
    aiperf_binary,
    profiling_span_s,
    read_aggregate,
)
from continuum_lab.harness.server import GPU_SHIM_ENV, GPU_SHIM_FLAGS, SGLangServer, cpu_split, on_cores, tree_cores
from continuum_lab.workloads import mooncake_trace

DEFAULT_TRACE = Path("workloads") / "aiperf" / "claude-code-kvtester-cpu.mooncake.jsonl"
GRACE_S = 30.0  # AIPerf's --benchmark-grace-period default: answers this long after the window count
START_UP_S = 300.0  # what an AIPerf run may take beyond warm-up, window and grace (its start, the drain)
# AIPerf 0.13.0 gives a warm-up's unfinished sessions their concurrency slots back only when the
# phase's last request returns after its sending ended (credit/callback_handler.py
# _release_slots_for_return); a warm-up that ends with no request in flight (every session between
# turns) keeps them all, and the measured phase can start no session
STARVED_PROFILING = "Phase profiling (profiling) sending complete | sent=0"
STARVED_WHY = (
    "AIPerf's measured phase sent nothing: its warm-up ended with every session between turns, and "
    "AIPerf 0.13.0 then keeps their concurrency slots; rerun, or use more --sessions or --warmup-s 0"
)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="continuum-aiperf", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="mooncake_trace JSONL, workload JSONL or .json")
    ap.add_argument("--token-scale", type=float, default=1.0, help="convert the trace with token counts x this")
    ap.add_argument("--programs", type=int, default=0, help="convert only this many programs, evenly spaced")
    ap.add_argument("--model", required=True, help="model path for the servers; AIPerf's model and tokenizer")
    ap.add_argument("--served-model-name", help="the model name AIPerf sends (default: --model)")
    ap.add_argument("--tokenizer", help="AIPerf's tokenizer (default: --model)")
    ap.add_argument("--url", help="drive this running server instead of starting one per run (one policy)")
    ap.add_argument("--policies", default="fcfs,lpm,continuum")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--sessions", type=int, default=16, help="sessions in flight (AIPerf's --concurrency)")
    ap.add_argument("--window-s", type=float, default=90.0, help="the measured phase (AIPerf's --benchmark-duration)")
    ap.add_argument("--warmup-s", type=float, default=30.0, help="AIPerf's --warmup-duration (0: none)")
    ap.add_argument("--max-gap-s", type=float, default=10.0, help="cap gaps (AIPerf's --inter-turn-delay-cap-seconds)")
    ap.add_argument("--no-gap-cap", action="store_true", help="the trace's gaps as recorded")
    ap.add_argument("--pool-programs", type=float, default=3.0, help="KV pool: average contexts (0: SGLang's own)")
    ap.add_argument("--max-total-tokens", type=int, default=0, help="KV pool size in tokens (overrides the above)")
    ap.add_argument("--server-args", default="", help="extra flags for every server, quoted")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server (repeatable)")
    ap.add_argument("--gpu", nargs="?", const="stock", choices=["stock", "shim"], help="servers without CPU flags")
    ap.add_argument("--prefill-profile", type=Path, help="the plugin's prefill profile (default on CPU: the CPU one)")
    ap.add_argument("--identity", choices=IDENTITIES, default="routing-key", help="program identity AIPerf sends")
    ap.add_argument("--aiperf-args", default="", help="extra flags for aiperf profile, quoted")
    ap.add_argument("--aiperf-venv", type=Path, default=AIPERF_VENV)
    ap.add_argument("--no-pin-cpus", action="store_true", help="do not pin server and AIPerf to different cores")
    ap.add_argument("--scrape-every-s", type=float, default=2.0, help="the server's /metrics, this often")
    ap.add_argument("--out", type=Path, default=Path("out/aiperf"))
    args = ap.parse_args(argv)
    if args.no_gap_cap:
        args.max_gap_s = None
    if args.sessions < 1 or args.window_s <= 0 or args.warmup_s < 0 or args.token_scale <= 0:
        ap.error("--sessions >= 1, --window-s > 0, --warmup-s >= 0 and --token-scale > 0, please")
    return args


def is_mooncake(path: Path) -> bool:
    """A multi-turn ``mooncake_trace`` file (its first row has ``session_id`` and ``input_length``)."""
    if path.suffix != ".jsonl":
        return False
    with path.open("rb") as f:
        first = next((line for line in f if line.strip()), b"{}")
    row = orjson.loads(first)
    return "session_id" in row and "input_length" in row


def prepare_trace(args) -> Path:
    """The trace AIPerf reads: ``--trace`` itself, or its conversion into ``OUT``."""
    if is_mooncake(args.trace) and args.token_scale == 1.0 and not args.programs:
        return args.trace
    if is_mooncake(args.trace):
        programs = mooncake_trace.read_trace(args.trace)
    else:
        programs = mooncake_trace.load_source([args.trace])
    programs = [mooncake_trace.scale_tokens(p, args.token_scale) for p in programs]
    programs = mooncake_trace.evenly_spaced(programs, args.programs)
    out = mooncake_trace.write_trace(programs, args.out / "trace.mooncake.jsonl")
    print(f"trace {args.trace} -> {out}: {mooncake_trace.summary(programs)}")
    return out


def server_setup(args, programs) -> tuple[list[str], dict, Optional[int]]:
    """The flags and environment every server gets (``continuum-bench``'s), and the KV pool."""
    pool = args.max_total_tokens or (pressure_pool_tokens(programs, args.pool_programs) if args.pool_programs else None)
    env = {**(GPU_SHIM_ENV if args.gpu == "shim" else {}), **dict(kv.split("=", 1) for kv in args.env)}
    profile = args.prefill_profile or (None if args.gpu else CPU_PROFILE)
    if profile is not None and Path(profile).is_file():
        env.setdefault("SGLANG_CONTINUUM_PREFILL_PROFILE", str(Path(profile).resolve()))
    common = ["--enable-metrics", "--enable-cache-report"]
    if pool:
        common = ["--max-total-tokens", str(pool), "--context-length", str(context_length(args.model, pool)), *common]
    common += [*(GPU_SHIM_FLAGS if args.gpu == "shim" else ()), *shlex.split(args.server_args)]
    return common, env, pool


def flush(url: str) -> bool:
    """Empty a running server's cache before a seed (SGLang refuses while requests run)."""
    for _ in range(10):
        try:
            if httpx.post(url + "/flush_cache", timeout=30).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return False


def drive(args, binary: Path, trace: Path, url: str, policy: str, seed: int, cpus) -> dict:
    """One AIPerf run against ``url``, the server's counters watched meanwhile: the run's record."""
    tag = f"{policy}-s{seed}"
    run = AIPerfRun(
        binary=binary, url=url, model=args.served_model_name or args.model, tokenizer=args.tokenizer or args.model,
        trace=trace.resolve(), concurrency=args.sessions, duration_s=args.window_s, warmup_s=args.warmup_s,
        seed=seed, artifact_dir=(args.out / f"aiperf-{tag}").resolve(), max_gap_s=args.max_gap_s,
        identity=args.identity, extra_args=shlex.split(args.aiperf_args),
    )  # fmt: skip
    started = time.time()
    with on_cores(cpus), MetricsWatch(url, args.scrape_every_s) as watch:  # AIPerf inherits the cores
        code = run.run(args.out / f"aiperf-{tag}.log", args.warmup_s + args.window_s + GRACE_S + START_UP_S)
    record = {"policy": policy, "seed": seed, "exit": code, "wall_s": time.time() - started,
              "aiperf_command": run.shell_command(), "artifact_dir": str(run.artifact_dir)}  # fmt: skip
    log = args.out / f"aiperf-{tag}.log"
    try:
        record["aiperf"] = aiperf_report.aiperf_figures(read_aggregate(run.artifact_dir))
    except (OSError, ValueError) as exc:
        record["aiperf"], record["problem"] = {}, f"no AIPerf export ({exc}); see {log}"
        if STARVED_PROFILING in log.read_text(errors="replace"):
            record["problem"] += f"; {STARVED_WHY}"
    span = profiling_span_s(run.artifact_dir)
    window = watch.window(span)
    record["server"] = aiperf_report.server_figures(window)
    record["window"] = {k: window[k] for k in ("from_s", "to_s", "span")} if window else None
    return record


def one_run(args, binary, trace, common, env, policy, seed, cpus) -> dict:
    """A fresh server for ``policy`` (or the running one at ``--url``), driven once."""
    server_cpus, client_cpus = cpus
    if args.url:
        if not flush(args.url):
            print(f"  {args.url}/flush_cache refused: seed {seed} starts on a warm cache", file=sys.stderr)
        return drive(args, binary, trace, args.url, policy, seed, client_cpus) | {"server_cores": None}
    flags, policy_env = parse_policy(policy, cpu=not args.gpu)
    log = args.out / f"server-{policy}-s{seed}.log"
    with SGLangServer(args.model, [*flags, *common], env={**policy_env, **env}, log_path=log, cpu=not args.gpu,
                      cpus=server_cpus) as server:  # fmt: skip
        record = drive(args, binary, trace, server.url, policy, seed, client_cpus)
        record["server_cores"] = tree_cores(server.proc.pid)
        server.stop(graceful=False)  # everything is read: skip SGLang's ~5 s graceful exit
    return record


def describe(args, trace: Path, programs, pool: Optional[int], cpus, version: Optional[str]) -> str:
    """Where and how the figures were measured, for the report's head."""
    server_cpus, client_cpus = cpus
    if args.url:
        where = f"the running server at {args.url} (labelled {args.policies.split(',')[0]}), its cache flushed per seed"
    else:
        kind = "GPU" if args.gpu else "CPU"
        where = (f"a fresh SGLang 0.5.23 server per run on this machine's {kind} ({args.model}), the server on cores "
                 f"{sorted(server_cpus) if server_cpus else 'all'}, AIPerf on {sorted(client_cpus) if client_cpus else 'all'}")  # fmt: skip
    gaps = "as recorded" if args.max_gap_s is None else f"capped at {args.max_gap_s:g} s"
    pool_text = f"KV pool {pool} tokens ({pool_regime(programs, pool)})" if pool else "SGLang's own KV pool"
    return (
        f"**MEASURED** by AIPerf {version or '?'} against {where}. Trace `{trace}` "
        f"({mooncake_trace.summary(programs)}), gaps {gaps}; {args.sessions} sessions in flight (AIPerf "
        f"`--concurrency`), a {args.warmup_s:g} s warm-up phase, then a {args.window_s:g} s measured phase "
        f"(answers up to {GRACE_S:g} s after it count); {pool_text}; program identity: "
        + ("AIPerf's per-session `X-SMG-Routing-Key`." if args.identity == "routing-key" else "none sent (inferred).")
    )


def write_report(args, runs: list[dict], head: str, command: str, started: float) -> None:
    rows = aiperf_report.aggregate([r for r in runs if r.get("aiperf")])
    report = {"command": command, "backend": "aiperf", "measured": head, "policies": args.policies.split(","),
              "seeds": args.seeds, "rows": rows, "runs": runs, "elapsed_s": time.time() - started}  # fmt: skip
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    md = [
        f"# continuum-aiperf: {Path(args.trace).name}",
        "",
        f"Command: `{command}`",
        "",
        head,
        "",
        "## Per policy (median over seeds, lowest-highest in brackets)",
        "",
        aiperf_report.policy_table(rows),
        "",
        "AIPerf's figures: output tok/s and requests/s over its benchmark duration (first request to last "
        "response of the measured phase); TTFT from its streamed requests; cache read %: the prompt tokens the "
        "server reported cached (`usage.prompt_tokens_details.cached_tokens`). The server's: its `/metrics` over "
        "the same phase (SGLang's cached / prompt tokens; the plugin's pins and the requests it identified by "
        "routing key or inferred). vs best stock: the policy's AIPerf output tok/s / the best stock policy's on "
        "the same seed (median, worst seed in brackets), and the same ratio of TTFT p90 (<1: lower).",
        "",
        "## Every run",
        "",
        aiperf_report.runs_table(runs),
        "",
        "AIPerf's command of each run is in `report.json` (`runs[].aiperf_command`); its exports in "
        "`aiperf-POLICY-sSEED/`.",
        "",
    ]
    (args.out / "report.md").write_text("\n".join(md))


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    binary = aiperf_binary(args.aiperf_venv)
    if binary is None:
        print(f"no aiperf in {args.aiperf_venv}: run `bash scripts/setup-aiperf.sh` first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()][: 1 if args.url else None]
    trace = prepare_trace(args)
    programs = mooncake_trace.read_trace(trace)
    common, env, pool = server_setup(args, programs)
    cpus = (None, None) if args.url else cpu_split(not args.no_pin_cpus)
    command = "continuum-aiperf " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started, runs, version = time.time(), [], None
    for seed in args.seeds:  # seed-major, policies interleaved within a seed: drift hits every policy alike
        for policy in policies:
            print(f"{policy}, seed {seed}: starting", flush=True)
            record = one_run(args, binary, trace, common, env, policy, seed, cpus)
            runs.append(record)
            a = record.get("aiperf", {})
            version = version or a.get("aiperf_version")
            print(f"  {policy}, seed {seed}: exit {record['exit']}, {_brief(record)}", flush=True)
            write_report(args, runs, describe(args, trace, programs, pool, cpus, version), command, started)
    print(f"\nreport: {args.out / 'report.md'} ({time.time() - started:.0f}s)")
    return 0 if runs and all(r["exit"] == 0 and r.get("aiperf") for r in runs) else 1


def _brief(record: dict) -> str:
    a, s = record.get("aiperf", {}), record.get("server", {})
    if not a:
        return record.get("problem", "no figures")
    parts = [f"AIPerf {a.get('output_tokens_per_s') or 0:.1f} output tok/s", f"TTFT p90 {a.get('ttft_p90_s') or 0:.2f} s",
             f"cache read {a.get('cache_read_pct') or 0:.1f}%", f"{a.get('requests') or 0:.0f} requests"]  # fmt: skip
    if s.get("cache_hit") is not None:
        parts.append(f"server cached {s['cache_hit']:.1%}")
    if "pins_created" in s:
        parts.append(f"{s['pins_created']:.0f} pins, {s['pin_hits']:.0f} hits, {s['requests_routing_key']:.0f} by key")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
