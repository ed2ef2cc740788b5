"""``continuum-bench --applications FILE --aps RATES``: multi-agent applications (Tokencake's
Code-Writer and Deep Research, ``workloads/multi_agent.py``) arriving as a seeded Poisson process,
every policy on every seed, interleaved as the program grid is (``seeds.run_order``).

An application's agents start as their dependencies end (``bench/applications.py``), each a
multi-turn program sent as the replay sends programs; ``--hints`` adds each turn's client hints
(``app_id``, ``critical``, ``tool_time_s``). Emulated (``--emulate``: the KV pool sampled from the
scheduler's own accounting every ``--kv-sample-s`` virtual seconds), against fresh servers
(``--model``) or against a running one (``--url``, one policy); on a server the KV use is SGLang's
``sglang:token_usage`` gauge, scraped as often. The tables are ``bench/applications_report.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Iterator

from continuum_lab.bench import applications_report
from continuum_lab.bench.applications import application_figures, replay_applications
from continuum_lab.bench.policies import parse_policy, tlru_config
from continuum_lab.bench.replay import Replayer, ReplayResult, client_patience
from continuum_lab.bench.report import emulated_loops, summarize
from continuum_lab.bench.seeds import run_order
from continuum_lab.cli.emulated_runs import emulator_figures
from continuum_lab.harness.server import SGLangServer, cpu_split, on_cores, parse_metrics
from continuum_lab.workloads.applications import Application, agent_programs, load_applications
from continuum_lab.workloads.multi_agent import summary
from continuum_lab.workloads.schema import Program

TOKEN_USAGE = "sglang:token_usage"  # SGLang's share of the pool neither free nor evictable
MAX_SCRAPES = 20_000  # the server's KV marks: more than any run lasts, cancelled when it ends
# what a run's figures keep of the program figures (``report.summarize``)
PROGRAM_FIGURES = ("tokens_per_s", "mean_turn_wait_s", "max_request_wait_s", "max_program_wait_s", "mean_ttft_s",
                   "cache_hit_ratio", "pin_hits", "host_loaded_tokens", "timeouts", "retries", "failed_requests",
                   "output_tokens", "prompt_tokens", "wall_s", "pins_created", "pin_sheds", "sheds_gap",
                   "host_load_wait_s", "uploads_started", "uploads_used", "uploads_wasted", "uploads_failed",
                   "upload_tokens")  # fmt: skip


def add_application_arguments(ap) -> None:
    ap.add_argument("--applications", type=Path, help="multi-agent applications, JSONL (workloads/applications.py)")
    ap.add_argument("--aps", help="--applications: applications per second (default 0.5), a list sweeps: 0.25,0.5")
    ap.add_argument(
        "--hints",
        action="store_true",
        help="--applications: send app_id, critical and tool times; --sessions: tool times",
    )
    ap.add_argument("--kv-sample-s", type=float, default=1.0, help="--applications: sample KV use this often (s)")


def check_application_arguments(ap, args) -> None:
    if not args.applications:
        if args.aps or (args.hints and not args.sessions):
            ap.error("--aps goes with --applications, --hints with --applications or --sessions")
        return
    given = {"--workload": args.workload is not None, "--rollout": bool(args.rollout), "--sessions": bool(args.sessions),
             "--jps": args.jps is not None, "--load": args.load is not None, "--tool-ratio": args.tool_ratio is not None,
             "--programs": bool(args.programs), "--workers": args.workers > 1}  # fmt: skip
    clash = [flag for flag, on in given.items() if on]
    if clash:
        ap.error(f"--applications runs its own agents at --aps: it excludes {', '.join(clash)}")
    try:
        rates = parse_rates(args.aps)
    except ValueError:
        rates = []
    if not rates or not all(r > 0 for r in rates) or not args.kv_sample_s > 0:
        ap.error("--aps takes positive rates (e.g. 0.25,0.5) and --kv-sample-s a positive interval")
    if not (args.emulate or args.url or args.model):
        ap.error("--applications needs --emulate PROFILE, --model (servers started per run) or --url")


def parse_rates(text) -> list[float]:
    return [float(x) for x in (text or "0.5").split(",") if x.strip()]


def application_programs(args) -> list[Program]:
    """Every agent's program (for the pool's size and tlru's settings)."""
    return agent_programs(load_applications(args.applications))


def _kv_samples(result: ReplayResult) -> list[list[float]]:
    """``[t, token_usage]`` at each scrape of the run."""
    out = []
    for mark, text in sorted(result.metrics_at.items(), key=lambda kv: float(kv[0])):
        values = parse_metrics(text, prefix=TOKEN_USAGE)
        if TOKEN_USAGE in values:
            out.append([float(mark), round(values[TOKEN_USAGE], 4)])
    return out


def server_runs(grid, args, apps: list[Application], server_args: list[str], env: dict) -> Iterator[dict]:
    """Each grid cell against a fresh real server (``--model``) or the running one (``--url``);
    each run's records are kept in ``OUT/runs/``, as an emulated run's are."""
    server_cpus, client_cpus = cpu_split(not args.no_pin_cpus and not args.url)
    marks = tuple(args.kv_sample_s * k for k in range(1, MAX_SCRAPES))
    for repeat, seed, aps, policy in grid:
        replayer = Replayer(args.url or "", api=args.api, vocab=args.vocab, seed=seed, identity=args.identity,
                            close_sessions=policy.partition("+")[0] == "session", scrape_at=marks,
                            client_timeout_s=args.client_timeout_s, client_retries=args.client_retries)  # fmt: skip
        if args.url:
            result = _replay(replayer, apps, aps, args.hints, client_cpus)
        else:
            flags, policy_env = parse_policy(policy, cpu=not args.gpu)
            if "tlru" in flags:
                flags += ["--radix-eviction-policy-config", json.dumps(tlru_config(agent_programs(apps)))]
            log = args.out / f"server-{policy}-aps{aps:g}-s{seed}-r{repeat}.log"
            with SGLangServer(args.model, [*flags, *server_args], env={**policy_env, **env}, log_path=log,
                              cpu=not args.gpu, cpus=server_cpus) as server:  # fmt: skip
                replayer.url = server.url
                result = _replay(replayer, apps, aps, args.hints, client_cpus)
                server.stop(graceful=False)
        kv = _kv_samples(result)
        result.metrics_at = {}  # the scrapes' texts are read: the KV series is what they were for
        run = {"policy": policy, "seed": seed, "jps": aps, "repeat": repeat, "kv_samples": kv,
               "replay": result.to_dict(), "metrics_before": result.metrics_before,
               "metrics_after": result.metrics_after}  # fmt: skip
        out = args.out / "runs" / f"{policy}-aps{aps:g}-s{seed}-r{repeat}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run))
        yield run


def _replay(replayer: Replayer, apps, aps: float, hints: bool, cpus) -> ReplayResult:
    with on_cores(cpus):
        return asyncio.run(replay_applications(replayer, apps, aps, hints=hints))


def run_record(run: dict, apps: list[Application], repeat: int) -> dict:
    """A run's figures: the application figures and what the program figures add."""
    result = ReplayResult.from_dict(run["replay"], run.get("metrics_before", ""), run.get("metrics_after", ""))
    result.metrics_at = {}
    program = summarize(result)
    figures = application_figures(result, apps, run["jps"], run["seed"], run.get("kv_samples") or [])
    figures |= {k: program.get(k) for k in PROGRAM_FIGURES}
    figures["output_tokens_per_s"] = program["output_tokens"] / result.wall_s if result.wall_s else 0.0
    record = {"policy": run["policy"], "aps": run["jps"], "seed": run["seed"], "repeat": repeat, "figures": figures}
    if "emulator" in run:
        record["emulator"] = emulator_figures(run)
    return record


def run_applications(args, policies, seeds, pool: int, server_args: list[str], env: dict, latency, command: str) -> int:
    started = time.time()
    apps = load_applications(args.applications)
    rates = parse_rates(args.aps)
    grid = run_order(policies, seeds, rates, args.repeat)
    shape = summary(apps)
    print(
        f"applications {args.applications}: {len(apps)} ({shape['agents_per_app']:.1f} agents each), "
        f"{', '.join(f'{r:g}' for r in rates)} apps/s, seeds {', '.join(map(str, seeds))}; KV pool {pool} tokens"
        + (f"; emulating {latency.name}" if latency else "")
    )
    if args.emulate:
        from continuum_lab.cli.emulated_runs import emulated_runs

        runs = emulated_runs(grid, args, pool, env)
    else:
        runs = server_runs(grid, args, apps, server_args, env)
    records = []
    for (repeat, *_), run in zip(grid, runs):
        records.append(record := run_record(run, apps, repeat))
        f = record["figures"]
        print(
            f"  {record['policy']} @ {record['aps']:g} apps/s, seed {record['seed']}: mean app latency "
            f"{f['app_latency_mean_s'] or float('nan'):.1f} s, P90 {f['app_latency_p90_s'] or float('nan'):.1f} s, "
            f"{f['abnormal_agents']} abnormal agents, KV used {f['kv_used_mean'] or 0:.1%}, "
            f"{f['finished_apps']}/{f['applications']} apps finished",
            flush=True,
        )
    rows = applications_report.aggregate(records)
    report = {
        "command": command,
        "backend": "emulator" if args.emulate else "server",
        "profile": latency.name if latency else None,
        "applications": str(args.applications),
        "workload": shape,
        "aps": rates,
        "hints": args.hints,
        "kv_sample_s": args.kv_sample_s,
        "kv_pool_tokens": pool,
        "server_args": server_args,
        "policies": policies,
        "seeds": seeds,
        "repeat": args.repeat,
        "client_timeout_s": args.client_timeout_s,
        "client_retries": args.client_retries,
        "rows": rows,
        "runs": records,
        "elapsed_s": time.time() - started,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    pngs = applications_report.plots(records, args.out)
    (args.out / "report.md").write_text(_markdown(args, report, records, rows, latency, pngs))
    print()
    print(applications_report.markdown(rows))
    print(f"\nreport: {args.out / 'report.md'} ({time.time() - started:.0f}s)")
    return 0 if all(r["figures"]["failed_apps"] == 0 for r in records) else 1


def _markdown(args, report: dict, records: list[dict], rows: list[dict], latency, pngs) -> str:
    w = report["workload"]
    backend = (
        f"**Emulated, predictions** (SGLang's scheduler on {emulated_loops(records)}, its radix cache and the "
        f"plugin in virtual time, each forward timed by the profile {latency.name!r}; every time below is "
        "predicted, not measured)"
        if args.emulate
        else f"**Measured** on real SGLang servers (`{args.url or '--model ' + str(args.model)}`)"
    )
    hints = "with client hints (app_id, critical, tool_time_s)" if args.hints else "without client hints"
    return "\n".join(
        [
            f"# continuum-bench --applications: {args.applications}",
            "",
            f"Command: `{report['command']}`",
            "",
            f"{backend}. {w['applications']} applications of {w['agents_per_app']:.1f} agents on average "
            f"({w['turns_per_agent']:.1f} turns each, a final context of {w['agent_context_tokens_mean']:.0f} tokens, "
            f"tools {w['tool_s_mean']:.2f} s on average; {w['critical_agents_per_app']:.1f} agents on the critical "
            f"path), arriving as a Poisson process at {', '.join(f'{r:g}' for r in report['aps'])} apps/s; an agent "
            f"starts when its dependencies have ended; {hints}; "
            f"{client_patience(args.client_timeout_s, args.client_retries)}. KV pool {report['kv_pool_tokens']} "
            f"tokens, server args `{args.server_args or '-'}`.",
            "",
            f"Seeds {', '.join(map(str, report['seeds']))}, policies interleaved, medians over seeds. App latency: "
            "arrival to its last agent's end (finished applications); spread: the interquartile range of the "
            "per-seed means; abnormal agents: execution time (an agent's start to its end) over 1.5x the mean of "
            "its agent type in the run; KV used: the share of the pool held by requests and pins (neither free nor "
            f"evictable), sampled every {args.kv_sample_s:g} s (`report.json` keeps a series per run); vs fcfs: "
            "fcfs's mean app latency over the policy's on the same seed and cache tiers (>1: faster), worst seed "
            "in brackets; failed apps and timeouts: summed over seeds.",
            "",
            applications_report.markdown(rows),
            "",
            "## Every run",
            "",
            applications_report.runs_markdown(records),
            "",
            *(f"![{p.stem}]({p.name})" for p in pngs),
            "",
        ]
    )
