"""One emulated run: one policy, one seed, one load; writes the run as JSON.

``continuum-bench --emulate`` runs each in a fresh process (as the server bench starts a fresh
server), forked from a server that imported SGLang once (``preload.py``), so no state, plugin
setting or Prometheus series leaks from one run to the next. By hand:

    python -m continuum_lab.emulator.run --workload W --policy continuum \\
        --profile configs/profiles/h100-sglang-llama-3.1-8b.json --jps 0.5 --seed 1 --out run.json
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import orjson


def emulate(
    workload: Optional[Path],
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
    identity: str = "ids",
    marks: tuple[float, ...] = (60.0,),
    sessions=None,
    until_s: Optional[float] = None,
    client_timeout_s: float = 0.0,
    client_retries: int = 0,
    applications: Optional[Path] = None,
    hints: bool = False,
    kv_every_s: float = 0.0,
) -> dict:
    """One run. ``sessions`` (a ``bench.sessions.SessionsProtocol``): N sessions in flight for a
    fixed window instead of Poisson arrivals at ``jps``; the run's JSON then has ``sessions``.
    ``until_s``: stop there, programs unfinished or not (an RL rollout step's time limit).
    ``client_timeout_s``/``client_retries``: when a client gives up on a try and how often it
    resends a turn (``bench/replay.py``; 0: it waits forever); with ``sessions``, the protocol's.
    ``applications``: multi-agent applications (``workloads/applications.py``) arriving at ``jps``
    per second instead of ``workload``'s programs, with their client hints if ``hints``;
    ``kv_every_s`` > 0: the run's JSON has the KV pool's use that often (``kv_samples``)."""
    from continuum_lab.bench.events import read_admission_log, summarize_admissions
    from continuum_lab.bench.policies import parse_policy, policy_named, tlru_config
    from continuum_lab.workloads.schema import load_workload
    from sglang_continuum.core.settings import ENV_PREFIX, ContinuumSettings, use_settings

    apps = None
    if applications is not None:
        from continuum_lab.workloads.applications import agent_programs, load_applications

        apps = load_applications(applications)
        programs = agent_programs(apps)
    else:
        programs = load_workload(workload)
    if programs_limit:
        programs = programs[:programs_limit]
    flags, _ = parse_policy(policy, cpu=True)
    if "tlru" in flags:
        flags += ["--radix-eviction-policy-config", json.dumps(tlru_config(programs))]
    # the plugin's settings, typed: the profile < the policy's < the caller's (``env``'s
    # SGLANG_CONTINUUM_* entries, checked like a server's environment); the rest of ``env`` is SGLang's
    env = dict(env or {})
    plugin_env = {k: env.pop(k) for k in list(env) if k.startswith(ENV_PREFIX)}
    named = {k[len(ENV_PREFIX) :].lower() for k in plugin_env}
    overrides = ContinuumSettings.load(environ=plugin_env).model_dump(include=named)
    values = {
        "prefill_profile": str(Path(profile_path).resolve()),
        **policy_named(policy).setting_values(),
        **overrides,
    }
    os.environ.update(env)

    from continuum_lab.emulator import sglang_engine as engine
    from continuum_lab.emulator.driver import ClosedLoopDriver
    from continuum_lab.emulator.step_model import StepLatencyModel
    from sglang_continuum.core.clock import ManualClock, use_clock

    latency = StepLatencyModel.load(profile_path)
    profile_flags = json.loads(Path(profile_path).read_text()).get("server_args", [])
    extra_flags = [*profile_flags, *shlex.split(server_args)]
    hicache = "--enable-hierarchical-cache" in flags
    if hicache:
        latency.check_host_transfers()
        extra_flags = engine.hicache_flags(extra_flags, max_total_tokens, latency.kv_bytes_per_token)
        # the plugin's reload cost reads the host pool's bytes per token, the accounting model's
        # 64: scale the bandwidth so that its transfer times are the profiled model's. Without a
        # prefill profile or a bandwidth (a plain launch) the plugin learns it from the loads.
        real = values.get("host_bandwidth_bytes_per_s") or (values.get("prefill_profile") and latency.host_bytes_per_s)
        if real:
            values["host_bandwidth_bytes_per_s"] = (
                real * engine.ACCOUNTING_KV_BYTES_PER_TOKEN / latency.kv_bytes_per_token
            )
    if sessions is not None:
        marks = (sessions.warmup_s, sessions.end_s)
        client_timeout_s, client_retries = sessions.client_timeout_s, sessions.client_retries
    clock = ManualClock(0.0)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="continuum-emu-") as tmp, use_clock(clock):
        model_dir = engine.write_accounting_model(Path(tmp) / "model")
        event_log = Path(values.setdefault("event_log", str(Path(tmp) / "events.jsonl")))
        with use_settings(ContinuumSettings(**values)):
            args, argv = engine.server_args_for(model_dir, max_total_tokens, flags, extra_flags)
            scheduler = engine.build_scheduler(args)
            engine.time_forwards_as_the_profiled_device(scheduler, latency)
            host = engine.count_host_transfers(scheduler) if hicache else None
            if host is not None and engine.host_pool_bytes_per_token(scheduler) != engine.ACCOUNTING_KV_BYTES_PER_TOKEN:
                raise RuntimeError(
                    f"the accounting model has {engine.host_pool_bytes_per_token(scheduler)} host KV bytes per token; update the bandwidth scaling"
                )
            build_s = time.perf_counter() - t0
            from prometheus_client import REGISTRY, generate_latest

            metrics_at: dict[str, str] = {}

            def on_mark(seconds: float) -> None:  # what a /metrics scrape at that time would read
                metrics_at[f"{seconds:g}"] = generate_latest(REGISTRY).decode()

            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(
                    total=sum(len(p.turns) for p in programs), desc=f"{policy} s{seed}", unit="turn", mininterval=5
                )
            driver = ClosedLoopDriver(
                scheduler,
                latency,
                clock,
                seed=seed,
                vocab=vocab,
                close_sessions=policy.partition("+")[0] == "session",
                identity=identity,
                on_turn=(lambda t: bar.update(1)) if bar is not None else None,
                host=host,
                marks=marks,
                on_mark=on_mark,
                client_timeout_s=client_timeout_s,
                client_retries=client_retries,
                kv_every_s=kv_every_s,
            )
            if apps is not None:
                result = driver.run_applications(apps, jps, hints=hints)
            elif sessions is None:
                result = driver.run(programs, jps, until=until_s)
            else:
                from continuum_lab.bench.sessions import session_programs

                source = session_programs(programs, seed, sessions.max_gap_s)
                driver.tool_times = hints
                result = driver.run_sessions(source, sessions.concurrency, sessions.start_times(), sessions.end_s)
                driver.counters_at.setdefault(sessions.end_s, driver.counters())
            if bar is not None:
                bar.close()
            pool = engine.pool_accounting(scheduler)
            log = getattr(scheduler.tree_cache, "event_log", None)
            if log is not None:
                log.flush()
        records = read_admission_log(event_log)
        admissions = summarize_admissions(records)
    window = None
    if sessions is not None:
        from continuum_lab.bench.sessions import held_back_turns, pin_ends, window_figures

        at = driver.counters_at
        counters = {"start": at.get(sessions.warmup_s, {}), "end": at[sessions.end_s]}
        held, ended = held_back_turns(records), pin_ends(records)
        window = {
            "protocol": sessions.to_dict(),
            "counters": counters,
            "figures": window_figures(result, sessions, counters, held, ended),
            "held_back": held,
            "pin_ends": ended,
        }
    return {
        "policy": policy,
        "seed": seed,
        "jps": jps,
        "until_s": until_s,
        "sessions": window,
        "replay": result.to_dict(),
        "metrics_after": generate_latest(REGISTRY).decode(),
        "admissions": admissions,
        "metrics_at": metrics_at,
        "kv_samples": driver.kv_samples,
        "emulator": {
            "profile": latency.name,
            "profile_path": str(profile_path),
            "server_argv": argv,
            "overlap": bool(scheduler.enable_overlap),  # SGLang's overlap scheduling (a server's default)
            "synchronous_forward": latency.synchronous_forward,
            "steps": driver.steps,
            "busy_s": driver.busy_s,
            "host_transfers": None
            if host is None
            else {
                "loaded_tokens": host.loaded_tokens,
                "written_tokens": host.written_tokens,
                "load_s": driver.host_load_s,
                "host_pool_tokens": engine.host_pool_tokens(scheduler),
            },
            "pool_after": pool,
            "build_s": build_s,
            "run_s": time.perf_counter() - t0 - build_s,
        },
    }


def main_logged(argv: list[str], log_path: str, bench_pid: int) -> None:
    """``main(argv)`` with its output in ``log_path``: the target of a run the bench forks;
    ``bench_pid``: the run ends when that process does."""
    _end_with(bench_pid)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.exit(main(argv))


def _end_with(pid: int) -> None:
    """End this process when ``pid`` ends. A run is forked by the bench's fork server, not by the
    bench, and that server outlives the bench while any run lives: without this a bench stopped by
    a signal leaves its runs computing on the cores the next benchmark measures with (Linux;
    elsewhere a run finishes on its own)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        return

    def watch() -> None:
        select.select([handle], [], [])  # readable once the process has ended
        os._exit(1)

    threading.Thread(target=watch, name="end-with-bench", daemon=True).start()


def main(argv: Optional[list[str]] = None) -> int:
    from continuum_lab.bench.replay import IDENTITIES, OPENAI_CLIENT_RETRIES, OPENAI_CLIENT_TIMEOUT_S

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, help="the programs (required unless --applications)")
    ap.add_argument("--applications", type=Path, help="multi-agent applications arriving at --jps per second")
    ap.add_argument("--hints", action="store_true", help="send app_id, critical and tool times (sessions: tool times)")
    ap.add_argument("--kv-sample-s", type=float, default=0.0, help="sample the KV pool's use this often (s)")
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
    ap.add_argument(
        "--identity", choices=IDENTITIES, default="ids", help="program metadata sent: all, the routing key only, none"
    )
    ap.add_argument("--sessions", type=int, default=0, help="N sessions in flight (bench/sessions.py) instead of --jps")
    ap.add_argument("--window-s", type=float, default=3600.0)
    ap.add_argument("--warmup-s", type=float, default=600.0)
    ap.add_argument("--max-gap-s", type=float, default=None, help="cap tool/think gaps (sessions)")
    ap.add_argument("--until-s", type=float, default=None, help="stop there, every program finished or not")
    ap.add_argument(
        "--client-timeout-s",
        type=float,
        default=OPENAI_CLIENT_TIMEOUT_S,
        help="a client gives up on a try without a first token this long (0: never)",
    )
    ap.add_argument("--client-retries", type=int, default=OPENAI_CLIENT_RETRIES, help="and resends a turn this often")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if (args.workload is None) == (args.applications is None):
        ap.error("one of --workload and --applications")
    protocol = None
    if args.sessions:
        from continuum_lab.bench.sessions import SessionsProtocol

        protocol = SessionsProtocol(args.sessions, args.window_s, args.warmup_s, args.max_gap_s,
                                    client_timeout_s=args.client_timeout_s, client_retries=args.client_retries)  # fmt: skip
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
        identity=args.identity,
        sessions=protocol,
        until_s=args.until_s,
        client_timeout_s=args.client_timeout_s,
        client_retries=args.client_retries,
        applications=args.applications,
        hints=args.hints,
        kv_every_s=args.kv_sample_s,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
