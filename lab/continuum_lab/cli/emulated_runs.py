"""``continuum-bench --emulate``'s runs: each grid cell an ``emulator.run`` process, forked from a
server that imported SGLang once; one launcher for every mode (``--jps``, ``--sessions``,
``--rollout``), and where each run's event log goes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional


def event_log_path(args, policy: str, label: str, seed: int, repeat: int) -> Path:
    """Where the run's server writes its event log (admissions; attributions with ``--no-ids``);
    ``label``: the load as file names give it (``5``, or ``auto`` with --jps auto)."""
    folder = args.out / ("runs" if args.emulate else "")
    return folder / f"events-{policy}-{label}-s{seed}-r{repeat}.jsonl"


def attribution_path(args, policy: str, label: str, seed: int, repeat: int) -> Optional[Path]:
    """The event log the run's attributions are read from (``--no-ids`` on a continuum policy)."""
    if args.identity != "none" or not policy.startswith("continuum") or args.url:
        return None
    return event_log_path(args, policy, label, seed, repeat)


def emulated_runs(grid, args, pool: int, extra_env: dict, workloads: Optional[dict[int, Path]] = None):
    """Each grid cell in its own ``emulator.run`` process, ``--jobs`` at a time; yields the runs in
    grid order. The processes are forked from one server that imported SGLang once
    (``emulator/preload.py``), with the bench's SGLang environment already in force there.
    ``workloads``: a workload per seed (``--rollout``: each seed's step), else ``--workload``'s."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    from continuum_lab.emulator.run import main_logged
    from sglang_continuum.core.settings import ENV_PREFIX

    # a run applies its SGLang variables before importing SGLang; forked runs import nothing, so
    # the server that imports it for them gets them first (the plugin's are each run's own)
    os.environ.update({k: v for k, v in extra_env.items() if not k.startswith(ENV_PREFIX)})
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(["continuum_lab.emulator.preload"])
    rollout = getattr(args, "rollout", "")
    applications = getattr(args, "applications", None)

    def one(cell) -> dict:
        repeat, seed, jps, policy = cell  # with --sessions, ``jps`` is the session count
        load = f"n{jps:g}" if args.sessions else f"rollout{rollout}" if rollout else f"{jps:g}"
        load = f"aps{jps:g}" if applications else load
        out = args.out / "runs" / f"{policy}-{load}-s{seed}-r{repeat}.json"
        workload = workloads[seed] if workloads else getattr(args, "run_workload", None) or args.workload
        cmd = [
            "--workload", str(workload), "--policy", policy, "--profile", str(args.emulate),
            "--jps", str(jps), "--seed", str(seed), "--max-total-tokens", str(pool),
            "--programs", str(args.programs), "--vocab", str(min(args.vocab, 1000)),
            "--server-args", args.server_args, "--out", str(out),
            "--client-timeout-s", str(args.client_timeout_s), "--client-retries", str(args.client_retries),
            *(f"--env={k}={v}" for k, v in extra_env.items()),
        ]  # fmt: skip
        if args.sessions:
            cmd[cmd.index("--jps") : cmd.index("--jps") + 2] = ["--jps", "0", "--sessions", str(int(jps))]
            cmd += ["--window-s", str(args.window_s), "--warmup-s", str(args.warmup_s)]
            cmd += [] if args.max_gap_s is None else ["--max-gap-s", str(args.max_gap_s)]
            cmd += ["--hints"] if args.hints else []
        if applications:  # agents started as their dependencies end, applications at ``jps`` per second
            cmd[0:2] = ["--applications", str(applications), "--kv-sample-s", str(args.kv_sample_s)]
            cmd += ["--hints"] if args.hints else []
        if rollout:  # every program at once (``jps`` 0), until the last ends or the time limit
            cmd += ["--until-s", str(args.rollout_limit_s)]
        log_path = attribution_path(args, policy, f"{jps:g}", seed, repeat)
        cmd.append(f"--identity={args.identity}")
        if log_path is not None:
            if not (args.reuse_runs and out.is_file()):
                log_path.unlink(missing_ok=True)
            cmd.append(f"--env=SGLANG_CONTINUUM_EVENT_LOG={log_path.resolve()}")
        if args.reuse_runs and out.is_file():
            return json.loads(out.read_text())
        log = out.with_suffix(".log")
        out.parent.mkdir(parents=True, exist_ok=True)
        child = forks.Process(target=main_logged, args=(cmd, str(log), os.getpid()), name=f"emulate {policy} s{seed}")
        child.start()
        child.join()
        rc = child.exitcode
        if rc != 0:
            tail = log.read_text()[-2000:]
            raise RuntimeError(f"emulated run {policy} seed {seed} @ {load} failed (rc {rc}); log {log}:\n{tail}")
        return json.loads(out.read_text())

    with ThreadPoolExecutor(max(1, args.jobs)) as pool_:
        yield from pool_.map(one, grid)


EMULATOR_FIGURES = ("steps", "busy_s", "host_transfers", "run_s", "overlap")


def emulator_figures(run: dict) -> dict:
    """What a grid's record keeps of an emulated run's own figures."""
    return {k: run["emulator"].get(k) for k in EMULATOR_FIGURES}
