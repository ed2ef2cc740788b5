"""``continuum-bench``: does an agent fleet finish sooner with ``--schedule-policy continuum``?

For each load (``--jps``) and each policy it starts one SGLang server with identical flags,
replays the identical seeded workload, scrapes ``/metrics``, stops the server, and finally writes
``report.json`` (everything), ``report.md`` (the table, ratios against fcfs) and PNG plots.

    continuum-bench --workload workloads/swe-cpu.jsonl --model .models/tiny-llama \\
        --policies fcfs,lpm,continuum-ref,continuum --jps 0.5 --out out/bench

Policies: ``fcfs``, ``lpm`` (SGLang's own), ``continuum-ref`` (continuum with the public
reference's fixed 2 s rule), ``continuum-fixed`` (fixed TTL), ``continuum`` (the cost model);
any of them with ``+hicache`` adds SGLang's host tier (``--enable-hierarchical-cache``) and is
compared with ``fcfs+hicache``.
``--url`` replays against an already running server instead (one policy, e.g. vLLM).
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

from sglang_continuum.bench.replay import Replayer
from sglang_continuum.bench.report import markdown_table, plots, summarize
from sglang_continuum.tools.server import SGLangServer
from sglang_continuum.workloads.schema import load_workload

POLICIES: dict[str, tuple[list[str], dict[str, str]]] = {
    "fcfs": (["--schedule-policy", "fcfs"], {}),
    "lpm": (["--schedule-policy", "lpm"], {}),
    "continuum-ref": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_TTL_MODEL": "reference"}),
    "continuum-fixed": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_TTL_MODEL": "fixed"}),
    "continuum": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_TTL_MODEL": "cost"}),
}
HICACHE_FLAGS = ["--enable-hierarchical-cache"]
# CPU servers: the direct io backend with the layer-first host layout (the one the CPU shim's
# stand-in for sgl_kernel's transfer_kv_direct serves; see README "Running SGLang on CPU")
HICACHE_CPU_FLAGS = ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"]
CPU_PROFILE = Path(__file__).resolve().parents[2] / "configs" / "profiles" / "cpu-tiny-llama.json"


def pressure_pool_tokens(programs, hold_programs: float) -> int:
    """A KV pool that holds about ``hold_programs`` average program contexts, and always the
    largest single request: the regime where keeping or dropping a program's KV matters."""
    ctx = [p.context_tokens for p in programs]
    biggest = max(ctx) + max(t.output_tokens for p in programs for t in p.turns)
    return int(max(biggest + 256, hold_programs * sum(ctx) / len(ctx)))


def parse_policy(name: str, *, cpu: bool = True) -> tuple[list[str], dict[str, str]]:
    base, _, extra = name.partition("+")
    if base not in POLICIES:
        raise SystemExit(f"unknown policy {name!r}; choose from {sorted(POLICIES)} (optionally +hicache)")
    args, env = POLICIES[base]
    if extra == "hicache":
        args = args + HICACHE_FLAGS + (HICACHE_CPU_FLAGS if cpu else [])
    elif extra:
        raise SystemExit(f"unknown policy suffix {extra!r}")
    return list(args), dict(env)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="continuum-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--model", help="model path for the servers this tool starts")
    ap.add_argument("--url", help="replay against this running server instead (no server is started)")
    ap.add_argument("--policies", default="fcfs,lpm,continuum-ref,continuum")
    ap.add_argument("--jps", default="0.5", help="programs per second; a list sweeps: 0.25,0.5,1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--programs", type=int, default=0, help="replay only the first N programs")
    ap.add_argument("--max-total-tokens", type=int, default=0, help="KV pool size; 0 = sized for pressure")
    ap.add_argument("--pool-programs", type=float, default=4.0, help="auto pool: average contexts it holds")
    ap.add_argument("--server-args", default="", help="extra flags for every server, quoted")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server (repeatable)")
    ap.add_argument("--gpu", action="store_true", help="start servers without the CPU flags")
    ap.add_argument("--api", choices=["sglang", "openai"], default="sglang")
    ap.add_argument("--vocab", type=int, default=500, help="token ids are drawn below this")
    ap.add_argument("--prefill-profile", type=Path, default=None,
                    help="profile for the cost model (default on CPU: configs/profiles/cpu-tiny-llama.json)")
    ap.add_argument("--out", type=Path, default=Path("out/bench"))
    args = ap.parse_args(argv)

    programs = load_workload(args.workload)
    if args.programs:
        programs = programs[: args.programs]
    jps_list = [float(x) for x in args.jps.split(",")]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.url:
        policies = policies[:1]
    pool = args.max_total_tokens or pressure_pool_tokens(programs, args.pool_programs)
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    profile = args.prefill_profile or (None if args.gpu else CPU_PROFILE)
    if profile is not None and Path(profile).is_file():
        extra_env.setdefault("SGLANG_CONTINUUM_PREFILL_PROFILE", str(Path(profile).resolve()))
    common = ["--max-total-tokens", str(pool), "--context-length", str(pool), "--enable-metrics",
              "--enable-cache-report", *shlex.split(args.server_args)]
    args.out.mkdir(parents=True, exist_ok=True)
    total_turns = sum(len(p.turns) for p in programs)
    print(f"workload {args.workload}: {len(programs)} programs, {total_turns} turns; KV pool {pool} tokens "
          f"(~{args.pool_programs:g} average program contexts: memory pressure)")

    runs = []
    started = time.time()
    for jps in jps_list:
        for policy in policies:
            replayer = Replayer(args.url or "", api=args.api, vocab=args.vocab, seed=args.seed)
            if args.url:
                result = _run(replayer, programs, jps, f"{policy} @ {jps:g} jps", total_turns)
            else:
                if not args.model:
                    ap.error("--model is required unless --url is given")
                flags, env = parse_policy(policy, cpu=not args.gpu)
                log = args.out / f"server-{policy}-{jps:g}.log"
                with SGLangServer(args.model, [*flags, *common], env={**env, **extra_env}, log_path=log,
                                  cpu=not args.gpu) as server:
                    replayer.url = server.url
                    result = _run(replayer, programs, jps, f"{policy} @ {jps:g} jps", total_turns)
            summary = summarize(result)
            runs.append({"policy": policy, "jps": jps, "summary": summary, "replay": result.to_dict()})
            print(f"  {policy} @ {jps:g}: mean JCT {summary['jct_mean_s']:.2f}s, P95 {summary['jct_p95_s']:.2f}s, "
                  f"cache hit {summary['cache_hit_ratio']:.1%}, failed requests {summary['failed_requests']}")

    rows = [{"policy": r["policy"], "jps": r["jps"], **r["summary"]} for r in runs]
    table = markdown_table(rows)
    command = "continuum-bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    report = {
        "command": command, "workload": str(args.workload), "programs": len(programs), "seed": args.seed,
        "kv_pool_tokens": pool, "server_args": common, "server_env": extra_env, "policies": policies, "jps": jps_list,
        "elapsed_s": time.time() - started, "rows": rows, "runs": runs,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    pngs = plots(runs, args.out)
    md = [
        f"# continuum-bench: {args.workload.name}", "", f"Command: `{command}`", "",
        f"{len(programs)} programs, {total_turns} turns, seed {args.seed}. KV pool {pool} tokens "
        f"(sized to hold ~{args.pool_programs:g} average program contexts, so the workload runs under memory "
        "pressure: the regime where keeping a program's KV between turns matters).", "",
        table, "",
        "JCT: first request sent to last response, per program. turn queue: mean time a turn waited in "
        "the server queue (SGLang's queue_time). cache hit: cached / prompt tokens.", "",
        *[f"![{p.stem}]({p.name})" for p in pngs],
    ]
    (args.out / "report.md").write_text("\n".join(md) + "\n")
    print()
    print(table)
    print(f"\nreport: {args.out / 'report.md'} ({time.time() - started:.0f}s)")
    return 0 if all(r["failed_requests"] == 0 for r in rows) else 1


def _run(replayer: Replayer, programs, jps: float, desc: str, total_turns: int):
    import asyncio

    with tqdm(total=total_turns, desc=desc, unit="turn", mininterval=2.0) as bar:
        replayer.on_turn = lambda t: bar.update(1)
        return asyncio.run(replayer.run(programs, jps))


if __name__ == "__main__":
    sys.exit(main())
