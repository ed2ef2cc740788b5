"""``continuum-bench --rollout GxN``: one RL rollout step per seed, every policy on it.

Agent RL frameworks on SGLang (slime, verl, AReaL) run a step as ``G`` prompts x ``N`` samples
released at once; each sample is a multi-turn agent trajectory and the step ends when the last
one does. Here each seed draws its own step (``workloads/rollout.py``: a group's samples share
their first prompt token for token, then diverge), all programs are sent at t = 0 and each runs
its turns back to back with its tool times between, until the last program ends or
``--rollout-limit-s`` (reported when hit). Emulated (``--emulate``) or against real servers
(``--model``: a fresh one per run; ``--url``: a running one, one policy); real servers sample at
temperature 1, as a rollout does, so the samples of a prompt diverge. The figures and the table
are ``bench/rollout_report.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Iterator

from continuum_lab.bench import rollout_report
from continuum_lab.bench.policies import parse_policy, tlru_config
from continuum_lab.bench.replay import Replayer, ReplayResult, client_patience
from continuum_lab.bench.report import emulated_loops
from continuum_lab.bench.seeds import run_order
from continuum_lab.cli.emulated_runs import emulator_figures
from continuum_lab.harness.server import SGLangServer, cpu_split, on_cores
from continuum_lab.workloads.generate import SPECS, summary
from continuum_lab.workloads.rollout import parse_shape, rollout_step
from continuum_lab.workloads.schema import Program, dump_workload

ROLLOUT_TEMPERATURE = 1.0  # real servers: samples of one prompt diverge at their first token


def add_rollout_arguments(ap) -> None:
    ap.add_argument(
        "--rollout",
        default="",
        metavar="GxN",
        help="an RL rollout step: G prompts x N samples released at once, e.g. 32x8; reports makespan and JCT",
    )
    ap.add_argument("--rollout-kind", choices=sorted(SPECS), default="swe", help="rollout: the samples' statistics")
    ap.add_argument("--rollout-token-scale", type=float, default=1.0, help="rollout: scale every token count")
    ap.add_argument("--rollout-tool-scale", type=float, default=1.0, help="rollout: scale every tool time")
    ap.add_argument(
        "--rollout-limit-s", type=float, default=3600.0, help="rollout: stop a step here (s; virtual when emulated)"
    )


def check_rollout_arguments(ap, args) -> None:
    if not args.rollout:
        if args.workload is None and not args.applications:
            ap.error("--workload is required (or --rollout GxN, which draws its own programs, or --applications)")
        return
    try:
        parse_shape(args.rollout)
    except ValueError as exc:
        ap.error(str(exc))
    given = {
        "--workload": args.workload is not None,
        "--sessions": bool(args.sessions),
        "--jps": args.jps is not None,
        "--load": args.load is not None,
        "--tool-ratio": args.tool_ratio is not None,
        "--programs": bool(args.programs),
        "--workers": args.workers > 1,
    }
    clash = [flag for flag, on in given.items() if on]
    if clash:
        ap.error(f"--rollout releases its own step's programs at once: it excludes {', '.join(clash)}")
    if not args.rollout_limit_s > 0 or not args.rollout_token_scale > 0 or not args.rollout_tool_scale >= 0:
        ap.error("--rollout-limit-s and --rollout-token-scale must be positive, --rollout-tool-scale not negative")
    if not (args.emulate or args.url or args.model):
        ap.error("--rollout needs --emulate PROFILE, --model (servers started per run) or --url")


def rollout_programs(args, seed: int) -> list[Program]:
    """The step ``seed`` draws."""
    groups, samples = parse_shape(args.rollout)
    return rollout_step(
        groups,
        samples,
        kind=args.rollout_kind,
        seed=seed,
        token_scale=args.rollout_token_scale,
        tool_scale=args.rollout_tool_scale,
    )


def server_runs(grid, args, steps: dict[int, list[Program]], server_args: list[str], env: dict) -> Iterator[dict]:
    """Each grid cell against a fresh real server (``--model``) or the running one (``--url``);
    each run's records are kept in ``OUT/runs/``."""
    server_cpus, client_cpus = cpu_split(not args.no_pin_cpus and not args.url)
    for repeat, seed, _, policy in grid:
        programs = steps[seed]
        replayer = Replayer(args.url or "", api=args.api, vocab=args.vocab, seed=seed, identity=args.identity,
                            close_sessions=policy.partition("+")[0] == "session", temperature=ROLLOUT_TEMPERATURE,
                            client_timeout_s=args.client_timeout_s, client_retries=args.client_retries)  # fmt: skip
        if args.url:
            result = _replay(replayer, programs, args.rollout_limit_s, client_cpus)
        else:
            flags, policy_env = parse_policy(policy, cpu=not args.gpu)
            if "tlru" in flags:
                flags += ["--radix-eviction-policy-config", json.dumps(tlru_config(programs))]
            log = args.out / f"server-{policy}-rollout{args.rollout}-s{seed}-r{repeat}.log"
            with SGLangServer(args.model, [*flags, *server_args], env={**policy_env, **env}, log_path=log,
                              cpu=not args.gpu, cpus=server_cpus) as server:  # fmt: skip
                replayer.url = server.url
                result = _replay(replayer, programs, args.rollout_limit_s, client_cpus)
                server.stop(graceful=False)
        run = {"policy": policy, "seed": seed, "repeat": repeat, "replay": result.to_dict()}
        out = args.out / "runs" / f"{policy}-rollout{args.rollout}-s{seed}-r{repeat}.json"  # as an emulated run's
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run))
        yield run


def _replay(replayer: Replayer, programs: list[Program], limit_s: float, cpus) -> ReplayResult:
    with on_cores(cpus):
        return asyncio.run(replayer.run(programs, 0.0, until=limit_s))


def run_rollout(args, policies, seeds, pool: int, server_args: list[str], env: dict, latency, command: str) -> int:
    started = time.time()
    groups, samples = parse_shape(args.rollout)
    steps = {seed: rollout_programs(args, seed) for seed in seeds}
    workloads = {
        seed: dump_workload(programs, args.out / "workloads" / f"rollout-{args.rollout}-s{seed}.jsonl")
        for seed, programs in steps.items()
    }
    grid = run_order(policies, seeds, [0.0], args.repeat)  # rate 0: every program at once
    print(
        f"rollout {groups}x{samples} ({args.rollout_kind}): {groups * samples} programs per step, seeds "
        f"{', '.join(map(str, seeds))}; KV pool {pool} tokens" + (f"; emulating {latency.name}" if latency else "")
    )
    if args.emulate:
        from continuum_lab.cli.emulated_runs import emulated_runs

        runs = emulated_runs(grid, args, pool, env, workloads=workloads)
    else:
        runs = server_runs(grid, args, steps, server_args, env)
    records = []
    for run in runs:
        record = {
            "policy": run["policy"],
            "seed": run["seed"],
            "repeat": run.get("repeat", 0),
            "figures": rollout_report.step_figures(ReplayResult.from_dict(run["replay"])),
        }
        if "emulator" in run:
            record["emulator"] = emulator_figures(run)
        records.append(record)
        f = record["figures"]
        print(
            f"  {record['policy']} seed {record['seed']}: makespan {f['makespan_s']:.1f} s, mean JCT "
            f"{f['jct_mean_s']:.1f} s, {f['finished']}/{f['programs']} finished, cached {f['cache_hit'] or 0:.1%}"
            + (f", {f['timeouts']} timeouts, {f['failed_programs']} programs failed by them" if f["timeouts"] else "")
            + (" (TIME LIMIT HIT)" if f["time_limit_hit"] else ""),
            flush=True,
        )
    rows = rollout_report.aggregate(records)
    report = {
        "command": command,
        "backend": "emulator" if args.emulate else "server",
        "profile": latency.name if latency else None,
        "rollout": {
            "groups": groups,
            "samples": samples,
            "kind": args.rollout_kind,
            "token_scale": args.rollout_token_scale,
            "tool_scale": args.rollout_tool_scale,
            "limit_s": args.rollout_limit_s,
            "client_timeout_s": args.client_timeout_s,
            "client_retries": args.client_retries,
        },  # fmt: skip
        "steps": {str(seed): _step_summary(programs) for seed, programs in steps.items()},
        "workloads": {str(seed): str(path) for seed, path in workloads.items()},
        "kv_pool_tokens": pool,
        "server_args": server_args,
        "policies": policies,
        "seeds": seeds,
        "rows": rows,
        "runs": records,
        "elapsed_s": time.time() - started,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    (args.out / "report.md").write_text(_markdown(args, report, records, rows, latency))
    print()
    print(rollout_report.markdown(rows))
    print(f"\nreport: {args.out / 'report.md'} ({time.time() - started:.0f}s)")
    return 0 if all(r["figures"]["failed"] == 0 for r in records) else 1


def _step_summary(programs: list[Program]) -> dict:
    prompts = [p.turns[0].append_tokens for p in programs]
    return summary(programs) | {"first_prompt_tokens_mean": sum(prompts) / len(prompts)}


def _markdown(args, report: dict, records: list[dict], rows: list[dict], latency) -> str:
    r = report["rollout"]
    steps = list(report["steps"].values())
    mean = lambda key: sum(s[key] for s in steps) / len(steps)
    hits = sum(rec["figures"]["time_limit_hit"] for rec in records)
    backend = (
        f"**Emulated, predictions** (SGLang's scheduler on {emulated_loops(records)}, its radix cache and the "
        f"plugin in virtual time, each forward timed by the profile {latency.name!r}; every time below is "
        "predicted, not measured)"
        if args.emulate
        else f"**Measured** on real SGLang servers (`{args.url or '--model ' + str(args.model)}`; outputs sampled "
        f"at temperature {ROLLOUT_TEMPERATURE:g})"
    )
    return "\n".join(
        [
            f"# continuum-bench --rollout {args.rollout}",
            "",
            f"Command: `{report['command']}`",
            "",
            f"{backend}. One RL rollout step per seed: {r['groups']} prompts x {r['samples']} samples = "
            f"{r['groups'] * r['samples']} {r['kind']}-like agent programs (token scale {r['token_scale']:g}, "
            f"tool scale {r['tool_scale']:g}; per program on average {mean('turns_mean'):.1f} turns, a final "
            f"context of {mean('tokens_mean'):.0f} tokens), the samples of a prompt sharing its first prompt "
            f"({mean('first_prompt_tokens_mean'):.0f} tokens on average) token for token. Every program is sent at t = 0 and runs its turns back to back, its tool times between; "
            f"the step ends when the last program does (time limit {r['limit_s']:g} s, hit in {hits} run(s)); "
            f"{client_patience(r['client_timeout_s'], r['client_retries'])}. KV "
            f"pool {report['kv_pool_tokens']} tokens, server args `{args.server_args or '-'}`.",
            "",
            f"Seeds {', '.join(map(str, report['seeds']))}, medians over seeds. Makespan: step start to the last "
            "program's end (worst seed in brackets); JCT: step start to a program's last response; output tok/s: "
            "output tokens over the makespan; cached: cached / prompt tokens. vs best stock: the makespan of the "
            "stock policy with the lowest median makespan (same cache tiers) over the policy's, same seed (>1: "
            "the step ends sooner), worst seed in brackets. A program the time limit cut off counts with the time "
            "it had run. timeouts / retries: tries with no first token in time (aborted, their tokens not counted) "
            "and the resends, summed over seeds; a program whose turn timed out on every try failed.",
            "",
            rollout_report.markdown(rows),
            "",
            "## Every run",
            "",
            rollout_report.runs_markdown(records),
            "",
        ]
    )
