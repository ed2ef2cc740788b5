"""One emulated run: one policy, one seed, one load; writes the run as JSON.

``continuum-bench --emulate`` starts this in a fresh process per run (as the server bench starts
a fresh server), so no state, plugin setting or Prometheus series leaks from one run to the next:

    python -m sglang_continuum.emulator.run --workload W --policy continuum \\
        --profile configs/profiles/h100-sglang-llama-3.1-8b.json --jps 0.5 --seed 1 --out run.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import orjson


def emulate(
    workload: Path,
    policy: str,
    profile_path: Path,
    *,
    jps: float,
    seed: int,
    max_total_tokens: int,
    programs_limit: int = 0,
    server_args: str = "",
    env: Optional[dict[str, str]] = None,
    vocab: int = 1000,
    progress: bool = False,
    no_ids: bool = False,
) -> dict:
    from sglang_continuum.bench.cli import parse_policy, tlru_config
    from sglang_continuum.workloads.schema import load_workload

    programs = load_workload(workload)
    if programs_limit:
        programs = programs[:programs_limit]
    flags, policy_env = parse_policy(policy, cpu=True)
    if "--enable-hierarchical-cache" in flags:
        raise SystemExit("the emulator does not model HiCache host transfers; drop +hicache")
    if "tlru" in flags:
        flags += ["--radix-eviction-policy-config", json.dumps(tlru_config(programs))]
    os.environ.update(policy_env)
    os.environ.update(env or {})
    os.environ.setdefault("SGLANG_CONTINUUM_PREFILL_PROFILE", str(Path(profile_path).resolve()))

    from sglang_continuum.core.admission_log import read_admission_log, summarize_admissions
    from sglang_continuum.core.clock import ManualClock, use_clock
    from sglang_continuum.emulator import sglang_engine as engine
    from sglang_continuum.emulator.driver import ClosedLoopDriver
    from sglang_continuum.emulator.step_model import StepLatencyModel

    latency = StepLatencyModel.load(profile_path)
    profile_flags = json.loads(Path(profile_path).read_text()).get("server_args", [])
    clock = ManualClock(0.0)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="continuum-emu-") as tmp, use_clock(clock):
        model_dir = engine.write_accounting_model(Path(tmp) / "model")
        admission_log = Path(tmp) / "admissions.jsonl"
        os.environ.setdefault("SGLANG_CONTINUUM_ADMISSION_LOG_PATH", str(admission_log))
        args, argv = engine.server_args_for(
            model_dir, max_total_tokens, flags, [*profile_flags, *shlex.split(server_args)]
        )
        scheduler = engine.build_scheduler(args)
        build_s = time.perf_counter() - t0
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=sum(len(p.turns) for p in programs), desc=f"{policy} s{seed}", unit="turn", mininterval=5)
        driver = ClosedLoopDriver(
            scheduler,
            latency,
            clock,
            seed=seed,
            vocab=vocab,
            close_sessions=policy.partition("+")[0] == "session",
            send_program_id=not no_ids,
            on_turn=(lambda t: bar.update(1)) if bar is not None else None,
        )
        result = driver.run(programs, jps)
        if bar is not None:
            bar.close()
        pool = engine.pool_accounting(scheduler)
        log = getattr(scheduler.tree_cache, "admission_log", None)
        if log is not None:
            log.flush()
        admissions = summarize_admissions(read_admission_log(admission_log))
    from prometheus_client import REGISTRY, generate_latest

    return {
        "policy": policy,
        "seed": seed,
        "jps": jps,
        "replay": result.to_dict(),
        "metrics_after": generate_latest(REGISTRY).decode(),
        "admissions": admissions,
        "emulator": {
            "profile": latency.name,
            "profile_path": str(profile_path),
            "server_argv": argv,
            "steps": driver.steps,
            "busy_s": driver.busy_s,
            "pool_after": pool,
            "build_s": build_s,
            "run_s": time.perf_counter() - t0 - build_s,
        },
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--jps", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-total-tokens", type=int, required=True)
    ap.add_argument("--programs", type=int, default=0)
    ap.add_argument("--server-args", default="")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--no-ids", action="store_true", help="send no program metadata (programs are inferred)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    run = emulate(
        args.workload,
        args.policy,
        args.profile,
        jps=args.jps,
        seed=args.seed,
        max_total_tokens=args.max_total_tokens,
        programs_limit=args.programs,
        server_args=args.server_args,
        env=dict(kv.split("=", 1) for kv in args.env),
        vocab=args.vocab,
        progress=args.progress,
        no_ids=args.no_ids,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
