"""``continuum-bench``: does an agent fleet finish sooner with ``--schedule-policy continuum``?

For each load (``--jps``) and each policy it starts one SGLang server with identical flags,
replays the identical seeded workload, scrapes ``/metrics``, stops the server, and finally writes
``report.json`` (everything), ``report.md`` (the table, ratios against fcfs) and PNG plots.

    continuum-bench --workload workloads/swe-cpu.jsonl --model .models/tiny-llama \\
        --policies fcfs,lpm,continuum-ref,continuum --jps 0.5 --out out/bench

Policies are named in ``bench/policies.py``.

``--seeds 1,2,3,4,5`` (and ``--repeat R``) runs every policy on every seed (the arrival process
and the replay's tokens), interleaved (``run_order``: policies innermost, so drift over time hits
all alike), and reports per policy the median, IQR and worst run, ratios against fcfs on the same
seed and against the best stock policy, the worst request wait and P99 request latency, and
collapsed runs (``bench/seeds.py``). On 2+ cores the server runs on all cores but the last and
the replay client on the last (``--no-pin-cpus`` turns that off; the server starts on every core
and is pinned once up, before the replay); each run records the cores its server's threads were
really allowed (``server_cores``).
``--url`` replays against an already running server instead (one policy, e.g. vLLM).

``--identity routing-key`` sends only SGLang's routing key; ``--identity none`` (``--no-ids``) sends
no program metadata at all (no ``custom_params``, ``session_id`` or routing key):
Continuum must infer programs from the prefix. Each server (or emulated run) writes which program
it attributed each request to (its ``event_log``); the report scores it against the truth
(precision and recall, ``bench/attribution.py``). Single servers and emulated runs only.

``--sessions 8,16,32`` measures as the field does on recorded agents (``bench/sessions.py``): N
sessions in flight for ``--window-s`` after ``--warmup-s``, gaps raw or capped (``--max-gap-s``);
figures per window (throughput, TTFT, cache by tier), not per program; on real servers or emulated.

``--rollout 32x8`` measures an RL rollout step (``cli/bench_rollout.py``): per seed, 32 prompts x 8
samples (a prompt's samples share it token for token, then diverge) released at once, the step
over when the last program ends (or at ``--rollout-limit-s``); makespan and JCT per policy.

``--client-timeout-s 600 --client-retries 2`` (the OpenAI Python SDK's, the default): a client
gives up on a try with no first token that long after its send, the server aborts it, and the turn
is sent again up to that many times; a turn that times out on every try fails its program
(``bench/replay.py``; emulated: in virtual time). ``--client-timeout-s 0`` waits forever. Reports
count the timeouts, retries and failed programs per policy, and only answered tries' tokens.

``--emulate PROFILE`` runs the same grid without a server: SGLang's real scheduler, radix cache
and this plugin in virtual time, the forward replaced by the profile's step latencies
(``lab/continuum_lab/emulator``). Each run is a fresh process (``--jobs`` at once); the KV pool is
``--max-total-tokens``, else the one the profile's GPU would hold, else sized for pressure as
above. Times in such a report are predicted, not measured (``"backend": "emulator"``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from continuum_lab.bench.attribution import read_log, score
from continuum_lab.bench.calibrate import DEFAULT_LOAD, AutoLoad, parse_load
from continuum_lab.bench.events import read_admission_log, summarize_admissions
from continuum_lab.bench.policies import (
    CPU_PROFILE,
    context_length,
    parse_policy,
    pool_regime,
    pressure_pool_tokens,
    tlru_config,
)
from continuum_lab.bench.replay import (
    IDENTITIES,
    OPENAI_CLIENT_RETRIES,
    OPENAI_CLIENT_TIMEOUT_S,
    Replayer,
    ReplayResult,
    client_patience,
)
from continuum_lab.bench.report import emulated_loops, markdown_table, plots, summarize
from continuum_lab.bench.seeds import aggregate, collapsed_flags, headline, run_order, seeds_table
from continuum_lab.cli.bench_applications import (
    add_application_arguments,
    application_programs,
    check_application_arguments,
    run_applications,
)
from continuum_lab.cli.bench_rollout import (
    add_rollout_arguments,
    check_rollout_arguments,
    rollout_programs,
    run_rollout,
)
from continuum_lab.cli.emulated_runs import attribution_path as _attribution_path
from continuum_lab.cli.emulated_runs import emulated_runs as _emulated_runs
from continuum_lab.cli.emulated_runs import event_log_path as _event_log_path
from continuum_lab.harness.fleet import ROUTER_ARGS, ROUTER_POLICIES, Fleet, fleet_summary, worker_table
from continuum_lab.harness.server import GPU_SHIM_ENV, GPU_SHIM_FLAGS, SGLangServer, cpu_split, on_cores, tree_cores
from continuum_lab.workloads.schema import load_workload


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="continuum-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, help="the programs, JSONL (required unless --rollout)")
    ap.add_argument("--model", help="model path for the servers this tool starts")
    ap.add_argument("--url", help="replay against this running server instead (no server is started)")
    ap.add_argument("--policies", default="fcfs,lpm,continuum-ref,continuum")
    ap.add_argument("--jps", help="programs/s (default 0.5), a list sweeps: 0.25,0.5,1; auto: --load x this machine's")
    ap.add_argument("--load", type=float, help=f"--jps auto: x the measured no-cache service rate ({DEFAULT_LOAD:g})")
    ap.add_argument("--tool-ratio", type=float, help="--jps auto: tool time x a program's no-cache prefill time")
    ap.add_argument("--seed", type=int, default=0, help="one arrival and token seed (see --seeds)")
    ap.add_argument("--seeds", default="", help="seeds to compare over, e.g. 1,2,3,4,5 (overrides --seed)")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole seeds x policies grid this many times")
    ap.add_argument("--no-pin-cpus", action="store_true", help="do not pin server and client to different cores")
    ap.add_argument("--programs", type=int, default=0, help="replay only the first N programs")
    ap.add_argument("--max-total-tokens", type=int, default=0, help="KV pool size; 0 = sized for pressure")
    ap.add_argument("--pool-programs", type=float, default=4.0, help="auto pool: average contexts it holds")
    ap.add_argument("--server-args", default="", help="extra flags for every server, quoted")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server (repeatable)")
    ap.add_argument(
        "--gpu",
        nargs="?",
        const="stock",
        choices=["stock", "shim"],
        help="start servers without the CPU flags; 'shim': with GPU_SHIM_FLAGS/ENV, no sgl_kernel (docs/gpu.md)",
    )
    ap.add_argument("--api", choices=["sglang", "openai"], default="sglang")
    ap.add_argument("--vocab", type=int, default=500, help="token ids are drawn below this")
    ap.add_argument(
        "--prefill-profile",
        type=Path,
        default=None,
        help="profile for the cost model (default on CPU: configs/profiles/cpu-tiny-llama.json)",
    )
    ap.add_argument("--emulate", type=Path, metavar="PROFILE", help="emulate a GPU from this step-latency profile")
    ap.add_argument("--jobs", type=int, default=1, help="emulated runs at once (each is one process)")
    ap.add_argument(
        "--reuse-runs", action="store_true", help="emulated runs already in OUT/runs are read, not run again"
    )
    ap.add_argument(
        "--summary-only", action="store_true", help="report.json without per-turn records (large emulated grids)"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="start this many workers behind SGLang's router (smg); a policy may name the router's "
        "policy after @, e.g. continuum@round_robin (default: --router-policy)",
    )
    ap.add_argument("--router", choices=["smg"], default="smg", help="the router in front of --workers > 1")
    ap.add_argument("--router-policy", default="consistent_hashing", choices=ROUTER_POLICIES)
    ap.add_argument(
        "--router-args",
        default=" ".join(ROUTER_ARGS),
        help="extra flags for smg, quoted (default: %(default)s; '' keeps smg's overload protection)",
    )
    ap.add_argument("--no-share-stats", action="store_true", help="workers keep their tool statistics to themselves")
    ap.add_argument(
        "--identity",
        choices=IDENTITIES,
        default="ids",
        help="program metadata the client sends: all of it (ids), SGLang's routing key only (an agent that changes "
        "nothing behind a router), or none (programs inferred from the prefix)",
    )
    ap.add_argument("--no-ids", dest="identity", action="store_const", const="none", help="= --identity none")
    ap.add_argument("--sessions", default="", help="fixed concurrency: N sessions in flight, a list sweeps: 8,16,32")
    ap.add_argument("--window-s", type=float, default=3600.0, help="sessions: the measured window (virtual s)")
    ap.add_argument("--warmup-s", type=float, default=600.0, help="sessions: not measured, before the window")
    ap.add_argument("--max-gap-s", type=float, default=None, help="sessions: cap tool/think gaps (raw if unset)")
    ap.add_argument(
        "--client-timeout-s",
        type=float,
        default=OPENAI_CLIENT_TIMEOUT_S,
        help="a client gives up on a try with no first token this long after its send (0: never; default: the "
        "OpenAI SDK's %(default)g)",
    )
    ap.add_argument(
        "--client-retries", type=int, default=OPENAI_CLIENT_RETRIES, help="...and resends a turn this often"
    )
    add_rollout_arguments(ap)
    add_application_arguments(ap)
    ap.add_argument("--out", type=Path, default=Path("out/bench"))
    args = ap.parse_args(argv)
    if args.client_timeout_s < 0 or args.client_retries < 0:
        ap.error("--client-timeout-s and --client-retries must not be negative")
    check_rollout_arguments(ap, args)
    check_application_arguments(ap, args)
    if args.sessions and (args.url or args.workers > 1):
        ap.error("--sessions starts one server (or emulates one) per run: it excludes --url and --workers")
    if args.emulate and args.url:
        ap.error("--emulate and --url exclude each other")
    if args.workers > 1 and (args.emulate or args.url):
        ap.error("--workers starts servers: it excludes --emulate and --url")

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()] or [args.seed]
    programs = (
        rollout_programs(args, seeds[0])
        if args.rollout
        else application_programs(args)
        if args.applications
        else load_workload(args.workload)
    )
    if args.programs:
        programs = programs[: args.programs]
    try:
        jps_list, load = parse_load(args.jps if args.jps is not None else ("" if args.load else "0.5"), args.load)
    except ValueError as exc:
        ap.error(str(exc))
    if load is not None and args.sessions:
        ap.error("--sessions holds N sessions in flight: --jps auto / --load do not apply")
    if args.tool_ratio is not None and (load is None or not args.tool_ratio > 0):
        ap.error("--tool-ratio needs --jps auto (the machine's measured speed) and a positive ratio")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.url:
        policies = policies[:1]
    latency = None
    if args.emulate:
        from continuum_lab.emulator.step_model import StepLatencyModel

        latency = StepLatencyModel.load(args.emulate)
    pool = args.max_total_tokens or emulated_pool(latency) or pressure_pool_tokens(programs, args.pool_programs)
    extra_env = {**(GPU_SHIM_ENV if args.gpu == "shim" else {}), **dict(kv.split("=", 1) for kv in args.env)}
    profile = args.prefill_profile or args.emulate or (None if args.gpu else CPU_PROFILE)
    if profile is not None and Path(profile).is_file():
        extra_env.setdefault("SGLANG_CONTINUUM_PREFILL_PROFILE", str(Path(profile).resolve()))
    elif profile is CPU_PROFILE:
        print(f"no {CPU_PROFILE} here (run from the repository root): the built-in prefill guess", file=sys.stderr)
    common = [
        "--max-total-tokens",
        str(pool),
        "--context-length",
        str(context_length(args.model, pool)),
        "--enable-metrics",
        "--enable-cache-report",
        *(GPU_SHIM_FLAGS if args.gpu == "shim" else ()),
        *shlex.split(args.server_args),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rollout:
        return run_rollout(args, policies, seeds, pool, common, extra_env, latency, _command(argv))
    if args.applications:
        return run_applications(args, policies, seeds, pool, common, extra_env, latency, _command(argv))
    total_turns = sum(len(p.turns) for p in programs)
    print(
        f"workload {args.workload}: {len(programs)} programs, {total_turns} turns; KV pool {pool} tokens "
        f"({pool_regime(programs, pool)})"
    )

    server_cpus, client_cpus = cpu_split(not args.no_pin_cpus and not args.emulate)
    try:
        auto = load and AutoLoad(
            programs, load, args.tool_ratio, latency=latency, vocab=args.vocab, cpus=client_cpus, out=args.out
        )
    except ValueError as exc:
        ap.error(str(exc))
    if auto and (args.emulate or args.url):  # else the first run's server is probed once it is up
        jps_list, programs = [auto(args.url, f"the server at {args.url}").jps], auto.programs
        args.run_workload = auto.workload_path or args.workload  # emulated runs read a file
    runs = []
    started = time.time()
    if args.sessions:
        from continuum_lab.cli.bench_sessions import run_grid, server_runs

        grid = list(run_order(policies, seeds, [int(x) for x in args.sessions.split(",")], args.repeat))
        if args.emulate:
            runs = _emulated_runs(grid, args, pool, extra_env)
        else:
            if not args.model:
                ap.error("--model is required unless --url or --emulate is given")
            runs = server_runs(grid, args, programs, common, extra_env, server_cpus, client_cpus)
        return run_grid(runs, args, programs, pool, latency.name if latency else None, _command(argv))
    grid = list(run_order(policies, seeds, jps_list, args.repeat))
    emulated = iter(())
    if args.emulate:
        print(
            f"emulating {latency.name} ({args.emulate}): SGLang's scheduler in virtual time, {args.jobs} run(s) at once"
        )
        emulated = _emulated_runs(grid, args, pool, extra_env)
    if auto and not jps_list:
        grid = [(r, s, None, p) for r, s, _, p in run_order(policies, seeds, [0.0], args.repeat)]
    for repeat, seed, jps, policy in grid:
        label = "auto" if jps is None else f"{jps:g}"  # in file names: known before the probe
        desc = f"{policy} @ {label} jps, seed {seed}"
        if args.emulate:
            run = next(emulated)
            result = ReplayResult.from_dict(run["replay"], "", run["metrics_after"])
            result.metrics_at = run.get("metrics_at", {})
            # the emulated scheduler's stage series count the emulation's own wall time: the
            # forwards are the profile's seconds, and nothing else is charged
            busy = run["emulator"]["busy_s"]
            summary = summarize(result) | {
                "server_forward_s": busy,
                "server_loop_s": 0.0,
                "server_idle_s": max(0.0, result.wall_s - busy),
            }
            if run.get("admissions"):
                summary["admissions"] = run["admissions"]
            runs.append(
                {"policy": policy, "jps": jps, "seed": seed, "repeat": repeat, "server_cores": None, "summary": summary}
                | {"emulator": run["emulator"], "replay": run["replay"]}
                | _attribution(args, result, _attribution_path(args, policy, label, seed, repeat))
            )
            _print_run(desc, summary)
            continue
        replayer = Replayer(
            args.url or "",
            api=args.api,
            vocab=args.vocab,
            seed=seed,
            close_sessions=policy.partition("+")[0] == "session",
            identity=args.identity,
            client_timeout_s=args.client_timeout_s,
            client_retries=args.client_retries,
        )
        attribution_log = _attribution_path(args, policy, label, seed, repeat)
        server_cores = None
        workers = None
        base_policy, _, router_policy = policy.partition("@")
        if args.url:
            result = _run(replayer, programs, jps, desc, total_turns, client_cpus)
        else:
            if not args.model:
                ap.error("--model is required unless --url is given")
            flags, env = parse_policy(base_policy, cpu=not args.gpu)
            if "tlru" in flags:
                flags += ["--radix-eviction-policy-config", json.dumps(tlru_config(programs))]
            log = args.out / f"server-{policy}-{label}-s{seed}-r{repeat}.log"
            if args.workers > 1 or router_policy:
                log_dir = args.out / f"fleet-{policy}-{label}-s{seed}-r{repeat}"
                log_dir.mkdir(parents=True, exist_ok=True)
                # smg routes OpenAI requests by model name (one server takes any): name it as the client does
                named = [] if "--served-model-name" in common else ["--served-model-name", replayer.model]
                with Fleet(
                    args.model,
                    [*flags, *common, *named],
                    workers=args.workers,
                    router_policy=router_policy or args.router_policy,
                    router_args=shlex.split(args.router_args),
                    env={**env, **extra_env},
                    share_stats=not args.no_share_stats,
                    log_dir=log_dir,
                    cpu=not args.gpu,
                    cpus=server_cpus,
                ) as fleet:
                    replayer.url, replayer.metrics_urls = fleet.url, fleet.worker_urls
                    if jps is None:
                        jps, programs = auto.first_run(fleet.url, f"fleet ({policy}, seed {seed})"), auto.programs
                        desc = f"{policy} @ {jps:g} jps, seed {seed}"
                    result = _run(replayer, programs, jps, desc, total_turns, client_cpus)
                    server_cores = sorted(set().union(*(tree_cores(w.proc.pid) for w in fleet.workers)))
                workers = worker_table(result.worker_metrics)
            else:
                event_log = _event_log_path(args, policy, label, seed, repeat)
                event_log.unlink(missing_ok=True)
                run_env = {**env, "SGLANG_CONTINUUM_EVENT_LOG": str(event_log.resolve()), **extra_env}
                with SGLangServer(
                    args.model,
                    [*flags, *common],
                    env=run_env,
                    log_path=log,
                    cpu=not args.gpu,
                    cpus=server_cpus,
                ) as server:
                    replayer.url = server.url
                    if jps is None:
                        jps, programs = auto.first_run(server.url, f"server ({policy}, seed {seed})"), auto.programs
                        desc = f"{policy} @ {jps:g} jps, seed {seed}"
                    result = _run(replayer, programs, jps, desc, total_turns, client_cpus)
                    server_cores = tree_cores(server.proc.pid)
                    # everything is read (metrics scraped; the admission log is flushed when the
                    # server goes idle, right after its last step): skip SGLang's graceful exit,
                    # ~5 s of its watchdog poll per run
                    time.sleep(0.5)
                    server.stop(graceful=False)
        summary = summarize(result)
        if workers is not None:
            summary |= fleet_summary(workers)
        elif not args.url:
            admissions = summarize_admissions(read_admission_log(event_log))
            if admissions:
                summary["admissions"] = admissions
        runs.append(
            {
                "policy": policy,
                "jps": jps,
                "seed": seed,
                "repeat": repeat,
                "server_cores": server_cores,
                "summary": summary,
                **({"workers": workers} if workers is not None else {}),
                **(_attribution(args, result, attribution_log) if workers is None and attribution_log else {}),
                "replay": result.to_dict(),
            }
        )
        _print_run(desc, summary)

    for run, collapsed in zip(runs, collapsed_flags(runs)):
        run["collapsed"] = collapsed
    rows = [{k: r[k] for k in ("policy", "jps", "seed", "repeat", "collapsed")} | r["summary"] for r in runs]
    table = markdown_table(rows)
    across = aggregate(runs)
    summary_md = seeds_table(across)
    head = "\n".join(headline(across, p) for p in policies if p.startswith("continuum"))
    command = _command(argv)
    report = {
        "command": command,
        "backend": "emulator" if args.emulate else "server",
        **({"profile": latency.name, "profile_path": str(args.emulate)} if args.emulate else {}),
        "workload": str(args.workload),
        "programs": len(programs),
        "seeds": seeds,
        "repeat": args.repeat,
        "cpus": {"server": sorted(server_cpus or []), "client": sorted(client_cpus or [])},
        "across_seeds": across,
        "headline": head,
        "kv_pool_tokens": pool,
        "server_args": common,
        "server_env": extra_env,
        "policies": policies,
        "jps": jps_list or [r["jps"] for r in runs[:1]],
        "client_timeout_s": args.client_timeout_s,
        "client_retries": args.client_retries,
        **({"calibration": auto.calibration.to_dict()} if auto else {}),
        "elapsed_s": time.time() - started,
        "rows": rows,
        "runs": runs,
    }
    if args.summary_only:
        report["runs"] = [{k: v for k, v in r.items() if k != "replay"} for r in runs]
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    pngs = plots(runs, args.out)
    observed = sorted(set().union(*(r["server_cores"] or [] for r in runs))) or "-"
    md = [
        f"# continuum-bench: {args.workload.name}",
        "",
        f"Command: `{command}`",
        "",
        *([f"Load (`--jps auto`): {auto.calibration.headline()}", ""] if auto else []),
        f"{len(programs)} programs, {total_turns} turns, seeds {', '.join(map(str, seeds))}"
        f"{f' x {args.repeat} repeats' if args.repeat > 1 else ''}, policies interleaved. KV pool {pool} tokens "
        f"({pool_regime(programs, pool)}); {client_patience(args.client_timeout_s, args.client_retries)}. "
        + (
            f"**Emulated** (`--emulate {args.emulate}`): SGLang 0.5.23's scheduler on {emulated_loops(runs)}, "
            f"its radix cache and the plugin in virtual time, each forward timed by the profile {latency.name!r}; every time "
            "below is predicted, not measured."
            if args.emulate
            else f"Server on cores {sorted(server_cpus) if server_cpus else 'all'} (its threads' affinity, observed: "
            f"{observed}), replay client on {sorted(client_cpus) if client_cpus else 'all'}."
        ),
        "",
        *([head, ""] if head else []),
        "## Across seeds",
        "",
        summary_md,
        "",
        "Median/IQR/worst over the per-run mean JCTs; P95: median of the per-run P95 JCTs; vs fcfs: median over "
        "seeds of fcfs's mean JCT / the policy's on the same seed (>1: faster); vs best stock: the same against "
        "the stock SGLang policy other than fcfs with the lowest median (continuum policies only); max wait: the "
        "longest a single turn waited in the server queue (queue_time, else TTFT); program wait: the most one "
        "program waited, its turns' waits summed; P99 request: per-run P99 turn "
        "latency; collapsed: runs whose cache-hit ratio fell below half the policy's median (the re-prefill spiral); "
        "timeouts / failed programs: over every run (a failed program has no JCT: the JCTs are the survivors').",
        "",
        "## Every run",
        "",
        table,
        "",
        "JCT: first request sent to last response, per program. turn queue: mean time a turn waited in "
        "the server queue (SGLang's queue_time). cache hit: cached / prompt tokens. forward s / rest of loop s: "
        "the scheduler's wall time in forwards (SGLang's run_batch stage; emulated: the profile's seconds) and in "
        "the rest of its busy loop (emulated: not charged); timeouts: tries with no first token within the client "
        "timeout (aborted, resent up to the retries; their tokens not counted); failed: turns that failed (every "
        "try timed out, or the server refused it); failed programs: the programs such a turn stopped; '-': not "
        "measured.",
        "",
        *fleet_section(runs),
        *attribution_section(runs),
        *[f"![{p.stem}]({p.name})" for p in pngs],
    ]
    (args.out / "report.md").write_text("\n".join(md) + "\n")
    print()
    print(summary_md)
    if head:
        print("\n" + head)
    print(f"\nreport: {args.out / 'report.md'} ({time.time() - started:.0f}s)")
    return 0 if all(r["failed_requests"] == 0 for r in rows) else 1


def fleet_section(runs: list[dict]) -> list[str]:
    """Report lines for runs behind a router: per worker, what it served."""
    fleet_runs = [r for r in runs if r.get("workers")]
    if not fleet_runs:
        return []
    lines = [
        "## Per worker",
        "",
        "Read from each worker's own /metrics. affinity: of the programs whose last step carried its step "
        "number, the share whose every turn one worker served (counted by the workers); load spread: the "
        "busiest worker's prompt tokens over the mean.",
        "",
        "| policy | seed | affinity | load spread | worker | programs | requests | prompt tokens | cache hit "
        "| pin hits | mean queue s | stats sent / received |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fleet_runs:
        s = r["summary"]
        for i, w in enumerate(r["workers"]):
            lines.append(
                f"| {r['policy']} | {r['seed']} | {s['program_affinity']:.1%} | {s['load_spread']:.2f} | {i} "
                f"| {w['programs']:.0f} | {w['requests']:.0f} | {w['prompt_tokens']:.0f} | {w['cache_hit_ratio']:.1%} "
                f"| {w['pin_hits']:.0f} | {w['mean_queue_s']:.3f} "
                f"| {w['stats_samples_sent']:.0f} / {w['stats_samples_received']:.0f} |"
            )
    return [*lines, ""]


def _attribution(args, result: ReplayResult, log: Optional[Path]) -> dict:
    if log is None:
        return {}
    truth = [(p.program_id, len(p.turns)) for p in result.programs]
    scored = score(truth, read_log(log))
    print(
        f"  attribution: recall {_pct(scored['recall'])}, precision {_pct(scored['precision'])} "
        f"({scored['attributed_right']}/{scored['turns_after_first']} later turns)"
    )
    return {"attribution": scored, "attribution_log": str(log)}


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def attribution_section(runs: list[dict]) -> list[str]:
    scored = [r for r in runs if "attribution" in r]
    if not scored:
        return []
    lines = [
        "## Program attribution (no program id sent)",
        "",
        "No program metadata was sent; the server inferred programs from the prefix. Recall: later turns "
        "attributed to their own program's previous turn; precision: of the requests the server attributed to "
        "an earlier program, those it got right.",
        "",
        "| policy | jps | seed | later turns | right | recall | precision |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in scored:
        a = r["attribution"]
        lines.append(
            f"| {r['policy']} | {r['jps']:g} | {r['seed']} | {a['turns_after_first']} | {a['attributed_right']} "
            f"| {_pct(a['recall'])} | {_pct(a['precision'])} |"
        )
    return [*lines, ""]


def _print_run(desc: str, summary: dict) -> None:
    print(
        f"  {desc}: mean JCT {summary['jct_mean_s']:.2f}s, P95 {summary['jct_p95_s']:.2f}s, "
        f"cache hit {summary['cache_hit_ratio']:.1%}, max wait {summary['max_request_wait_s']:.2f}s, "
        f"failed requests {summary['failed_requests']}, timeouts {summary.get('timeouts', 0)}"
        + (f", program affinity {summary['program_affinity']:.1%}" if "program_affinity" in summary else "")
        + (
            f", first 60 s: {summary['pins_created_60s']:.0f} pins, {summary['pin_hits_60s']:.0f} hits"
            if "pins_created_60s" in summary
            else ""
        ),
        flush=True,
    )


def _command(argv: Optional[list[str]]) -> str:
    return "continuum-bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


def emulated_pool(latency) -> int:
    """The KV pool the profile's GPU would hold (0: the profile does not say)."""
    if latency is None:
        return 0
    try:
        return latency.kv_pool_tokens()
    except ValueError:
        return 0


def _run(replayer: Replayer, programs, jps: float, desc: str, total_turns: int, cpus: Optional[set[int]] = None):
    import asyncio

    with on_cores(cpus), tqdm(total=total_turns, desc=desc, unit="turn", mininterval=2.0) as bar:
        replayer.on_turn = lambda t: bar.update(1)
        return asyncio.run(replayer.run(programs, jps))


if __name__ == "__main__":
    sys.exit(main())
