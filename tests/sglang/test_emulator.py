"""Tier 2: the emulator drives SGLang's real scheduler (and the plugin) in virtual time.

Each run is a fresh ``python -m continuum_lab.emulator.run`` process (as ``continuum-bench
--emulate`` runs it), about 12 s each on 2 cores.
"""

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from continuum_lab.emulator.step_model import StepLatencyModel
from continuum_lab.harness.server import parse_metrics
from continuum_lab.workloads.schema import Program, Turn, dump_workload
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.sglang

PROFILE = {
    "name": "test-gpu",
    "coeffs": [0.02, 2e-5, 1e-9],
    "decode": {"coeffs": [0.01, 1e-4, 2e-8]},
    "kv_bytes_per_token": 131072,  # Llama-3.1-8B bf16
    "host_bytes_per_s": 1e10,
}


def _profile(tmp_path, **keys):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE | keys))
    return path


def _emulate(tmp_path, workload, policy, *, pool, jps=1.0, seed=0, name="run", env=(), server_args="", profile=None):
    out = tmp_path / f"{name}.json"
    cmd = [
        sys.executable, "-m", "continuum_lab.emulator.run", "--workload", str(workload), "--policy", policy,
        "--profile", str(profile or _profile(tmp_path)), "--jps", str(jps), "--seed", str(seed),
        "--max-total-tokens", str(pool), "--out", str(out), f"--server-args={server_args}",
        *(f"--env={kv}" for kv in env),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _agents(tmp_path, *, programs: int, append_tokens: int, gaps: tuple[float, ...]):
    """A workload of ``programs`` agents: a turn of ``append_tokens`` before each tool call of
    ``gaps`` seconds, then a short last turn."""
    trace = [
        Program(
            program_id=f"p{i}",
            turns=[
                *[Turn(append_tokens=append_tokens, output_tokens=8, tool="bash", tool_duration_s=g) for g in gaps],
                Turn(append_tokens=50, output_tokens=8),
            ],
        )
        for i in range(programs)
    ]
    return dump_workload(trace, tmp_path / "trace.jsonl")


def _turns(run):
    return [t for p in run["replay"]["programs"] for t in p["turns"]]


def _series(run, name):
    """``name`` summed over its labels (or a family's child: ``name{reason="last_step"}``)."""
    return parse_metrics(run["metrics_after"], prefix="sglang:").get(name, 0.0)


LOOPS = {  # SGLang's scheduler loop: overlapped on a GPU, overlapped on a CPU, serial
    "overlap": ({}, ""),
    "overlap-cpu": ({"synchronous_forward": True}, ""),
    "serial": ({}, "--disable-overlap-schedule"),
}


@pytest.mark.parametrize("loop", LOOPS)
def test_an_isolated_programs_time_is_its_predicted_steps_plus_its_tool_time(tmp_path, loop):
    keys, server_args = LOOPS[loop]
    workload = dump_workload(
        [
            Program(
                program_id="solo",
                turns=[
                    Turn(append_tokens=3000, output_tokens=20, tool="bash", tool_duration_s=1.5),
                    Turn(append_tokens=400, output_tokens=10),
                ],
            )
        ],
        tmp_path / "solo.jsonl",
    )
    profile = _profile(tmp_path, **keys)
    run = _emulate(tmp_path, workload, "fcfs", pool=20_000, profile=profile, server_args=server_args)
    assert run["emulator"]["overlap"] == (loop != "serial")
    model = StepLatencyModel.load(profile)
    t1, t2 = _turns(run)
    assert t1["cached_tokens"] == 0
    assert t2["cached_tokens"] >= 3000 + 20 - 1  # the whole first turn, less the unsampled last token

    def turn_time(prompt, cached, out):
        prefill = model.prefill_seconds([(prompt - cached, cached)])
        return prefill + sum(model.decode_seconds(1, prompt + k) for k in range(1, out))

    assert t1["finish"] - t1["send"] == pytest.approx(turn_time(3000, 0, 20), rel=1e-9)
    assert t2["send"] == pytest.approx(t1["finish"] + 1.5, rel=1e-12)
    assert t2["finish"] - t2["send"] == pytest.approx(turn_time(3420, t2["cached_tokens"], 10), rel=1e-9)
    assert t1["queue_time_s"] == 0.0 and t2["queue_time_s"] == 0.0
    assert run["replay"]["programs"][0]["jct"] == pytest.approx(t2["finish"] - t1["send"])
    # the first token goes out when the prefill's results are processed: on a CPU after the next
    # forward (the first decode step), which ran inside the launch before them
    first = model.prefill_seconds([(3000, 0)])
    if loop == "overlap-cpu":
        first += model.decode_seconds(1, 3001)
    assert t1["first_token"] - t1["send"] == pytest.approx(first, rel=1e-9)


@pytest.mark.parametrize("loop", ["overlap", "overlap-cpu"])
def test_without_a_profile_the_plugin_fits_the_prefill_cost_the_emulated_device_has(tmp_path, loop):
    """The plugin fits a prefill step's seconds to the scheduler loop's iterations
    (``core/engine_time.py``). Which batch an interval between two iterations belongs to depends on
    the loop: on an asynchronous device with overlap scheduling, the one launched before the last;
    where the forward returns when it is done (a CPU, as the serial loop), the last. Attributed
    right, the fit gives back the profile's own coefficients on both."""
    keys, server_args = LOOPS[loop]
    sizes = [(1500, 700, 300), (2600, 200, 900), (400, 1200, 2000), (3000, 500, 100)]
    programs = [
        Program(
            program_id=f"p{i}",
            turns=[Turn(append_tokens=n, output_tokens=6, tool="bash", tool_duration_s=0.5) for n in appends[:-1]]
            + [Turn(append_tokens=appends[-1], output_tokens=6)],
        )
        for i, appends in enumerate(sizes)
    ]
    workload = dump_workload(programs, tmp_path / "sizes.jsonl")
    profile = _profile(tmp_path, **keys)
    run = _emulate(tmp_path, workload, "continuum", pool=40_000, profile=profile, server_args=server_args,
                   jps=0.5, env=["SGLANG_CONTINUUM_PREFILL_PROFILE="])  # fmt: skip
    fitted = [
        _series(run, f"sglang:continuum_{name}")
        for name in ("prefill_step_seconds", "prefill_seconds_per_token", "prefill_seconds_per_pair")
    ]
    assert fitted == pytest.approx(PROFILE["coeffs"], rel=1e-6)


def test_without_a_bandwidth_the_plugin_learns_what_a_host_load_costs_the_emulated_device(tmp_path):
    """HiCache without a prefill profile or a host bandwidth (a plain launch): the plugin fits what
    a prefill step pays per token its selection loaded back from host, and gets the emulated
    device's transfer time (128 KiB a token at 10 GB/s), with the prefill's own three terms."""
    sizes = [(3000, 400, 800, 300), (2500, 900, 300, 500), (3500, 200, 600, 400), (2000, 1200, 500, 200),
             (3000, 700, 200, 600), (2800, 300, 900, 100), (2200, 500, 500, 500), (3300, 600, 100, 700)]  # fmt: skip
    programs = [
        Program(
            program_id=f"p{i}",
            turns=[
                Turn(append_tokens=n, output_tokens=6, tool="bash", tool_duration_s=2.0 + 0.3 * i) for n in appends[:-1]
            ]
            + [Turn(append_tokens=appends[-1], output_tokens=6)],
        )
        for i, appends in enumerate(sizes)
    ]
    workload = dump_workload(programs, tmp_path / "loads.jsonl")
    run = _emulate(tmp_path, workload, "continuum+hicache", pool=6000, jps=2.0, server_args="--hicache-ratio 6",
                   env=["SGLANG_CONTINUUM_PREFILL_PROFILE="])  # fmt: skip
    assert run["emulator"]["host_transfers"]["loaded_tokens"] > 20_000  # returns came back from host
    learned = _series(run, "sglang:continuum_host_load_seconds_per_token")
    assert learned == pytest.approx(PROFILE["kv_bytes_per_token"] / PROFILE["host_bytes_per_s"], rel=1e-6)
    fitted = [
        _series(run, f"sglang:continuum_{name}")
        for name in ("prefill_step_seconds", "prefill_seconds_per_token", "prefill_seconds_per_pair")
    ]
    assert fitted == pytest.approx(PROFILE["coeffs"], rel=1e-6)


def test_a_turn_reaching_an_idle_server_is_stamped_when_it_arrives_not_at_the_last_step(tmp_path):
    # One program whose tools take 2 s and whose misses cost ~0.1 s: the plugin must measure 2 s
    # tool times (no pin pays) and no wait. Stamped with the last busy step's time (the emulator
    # once jumped over idle time without the spinning loop's iterations), each tool time read as
    # one decode step (~10 ms), the cost model pinned for that, and each turn "waited" 2 s.
    turns = [Turn(append_tokens=3000, output_tokens=8, tool="bash", tool_duration_s=2.0) for _ in range(5)]
    turns.append(Turn(append_tokens=100, output_tokens=8))
    workload = dump_workload([Program(program_id="idle", turns=turns)], tmp_path / "idle.jsonl")
    run = _emulate(tmp_path, workload, "continuum", pool=40_000)
    assert [t["queue_time_s"] for t in _turns(run)] == [0.0] * 6
    assert run["admissions"]["requests"] == 6
    assert run["admissions"]["max_wait_s"] < 0.05
    assert _series(run, "sglang:continuum_pins_created_total") == 0


@pytest.fixture(scope="module")
def pressure_workload(tmp_path_factory):
    from continuum_lab.workloads.generate import generate

    programs = generate("swe", 10, seed=3, token_scale=0.05)
    return dump_workload(programs, tmp_path_factory.mktemp("emu") / "swe.jsonl"), programs


def _bench_forked_run(tmp_path, workload, policy, *, pool, jps, seed):
    """The same run as ``_emulate``'s, started by ``continuum-bench --emulate``: forked from its
    server that imported SGLang once (``emulator/preload.py``)."""
    from continuum_lab.cli.bench import main

    out = tmp_path / "bench"
    argv = [
        "--emulate", str(_profile(tmp_path)), "--workload", str(workload), "--policies", policy,
        "--jps", str(jps), "--seeds", str(seed), "--max-total-tokens", str(pool), "--vocab", "1000", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    return json.loads((out / "runs" / f"{policy}-{jps:g}-s{seed}-r0.json").read_text())


def test_continuum_runs_are_deterministic_forked_or_fresh_and_return_every_kv_slot(tmp_path, pressure_workload):
    workload, programs = pressure_workload
    pool = int(2.5 * sum(p.context_tokens for p in programs) / len(programs))
    # a fixed TTL, so that pins are made and hit: with these short contexts (misses cost ~0.1 s)
    # and ~1 s tools the cost model rightly pins nothing
    # side by side on the machine's two cores: virtual time does not see the contention
    with ThreadPoolExecutor(2) as pool_:
        fresh = pool_.submit(_emulate, tmp_path, workload, "continuum-fixed", pool=pool, jps=2.0, seed=1)
        forked = pool_.submit(_bench_forked_run, tmp_path, workload, "continuum-fixed", pool=pool, jps=2.0, seed=1)
        a, b = fresh.result(), forked.result()
    assert a["replay"] == b["replay"]
    # nothing the fork server imported carried state into the run: the plugin's series agree (SGLang's
    # own include wall-clock timings; every series' model_name label is the model's temp path)
    plugin_series = [
        [
            re.sub(r'model_name="[^"]*"', "", ln)
            for ln in r["metrics_after"].splitlines()
            if ln.startswith("sglang:continuum_") and "_created" not in ln
        ]
        for r in (a, b)
    ]
    assert plugin_series[0] == plugin_series[1] != []
    turns = _turns(a)
    assert len(turns) == sum(len(p.turns) for p in programs)
    assert all(
        t["error"] is None and t["output_tokens"] == spec.output_tokens
        for t, spec in zip(turns, (t for p in programs for t in p.turns))
    )
    accounting = a["emulator"]["pool_after"]
    assert accounting["protected"] == 0
    assert accounting["available"] + accounting["evictable"] == accounting["total"] == pool
    assert _series(a, "sglang:continuum_pins_created_total") > 0
    assert _series(a, "sglang:continuum_pin_hits_total") > 0


def test_under_pressure_continuum_keeps_more_of_the_next_turns_context_than_fcfs(tmp_path, pressure_workload):
    """On an engine where a lost context is dear (prefill 10x the test profile's: rebuilding one
    costs more than a batch place, so the door keeps programs resident and reserves their growth);
    where it is cheap, keeping them is not what the price asks for (tests/unit/test_door.py)."""
    workload, programs = pressure_workload
    pool = int(2.5 * sum(p.context_tokens for p in programs) / len(programs))
    profile = _profile(tmp_path, coeffs=[0.02, 2e-4, 1e-8])
    with ThreadPoolExecutor(2) as pool_:
        policies = ("fcfs", "continuum")
        runs = dict(
            zip(
                policies,
                pool_.map(
                    lambda p: _emulate(tmp_path, workload, p, pool=pool, jps=2.0, seed=1, name=p, profile=profile),
                    policies,
                ),
            )
        )
    later = {p: [t for t in _turns(r) if t["turn"] > 0] for p, r in runs.items()}
    hit = {p: sum(t["cached_tokens"] for t in ts) / sum(t["prompt_tokens"] for t in ts) for p, ts in later.items()}
    assert hit["continuum"] > hit["fcfs"]


def test_bench_emulate_reports_every_policy_as_an_emulated_run(tmp_path, pressure_workload):
    from continuum_lab.cli.bench import main

    workload, programs = pressure_workload
    out = tmp_path / "bench"
    rc = main(
        [
            "--emulate", str(_profile(tmp_path)), "--workload", str(workload), "--policies", "continuum-order-only,continuum-pins-only",
            "--jps", "2", "--seeds", "1", "--jobs", "2", "--programs", "6", "--pool-programs", "2", "--out", str(out),
        ]
    )  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert rc == 0
    assert report["backend"] == "emulator" and report["profile"] == "test-gpu"
    assert [r["policy"] for r in report["runs"]] == ["continuum-order-only", "continuum-pins-only"]
    for run in report["runs"]:
        assert run["summary"]["programs"] == 6 and run["summary"]["failed_requests"] == 0
        assert run["emulator"]["steps"]["prefill"] > 0
    metrics = {
        p: json.loads((out / "runs" / f"continuum-{p}-2-s1-r0.json").read_text()) for p in ("order-only", "pins-only")
    }
    budget = {p: _series(m, "sglang:continuum_pin_budget_tokens") for p, m in metrics.items()}
    assert budget["order-only"] == 0 < budget["pins-only"]  # each ablation's setting reached its scheduler
    ended = {p: _series(m, 'sglang:continuum_programs_ended_total{reason="last_step"}') for p, m in metrics.items()}
    assert ended == {"order-only": 6, "pins-only": 6}  # metrics published at the final idle step
    assert "**Emulated**" in (out / "report.md").read_text()
    assert "scheduler on its overlap loop, as a server runs it" in (out / "report.md").read_text()


def test_a_turn_longer_than_the_context_fails_its_program_as_a_server_would(tmp_path):
    too_long = Program(
        program_id="long",
        turns=[
            Turn(append_tokens=3000, output_tokens=10, tool="bash", tool_duration_s=0.5),
            Turn(append_tokens=4000, output_tokens=10, tool="bash", tool_duration_s=0.5),
            Turn(append_tokens=100, output_tokens=10),
        ],
    )
    fine = Program(
        program_id="fine",
        turns=[
            Turn(append_tokens=500, output_tokens=10, tool="bash", tool_duration_s=0.5),
            Turn(append_tokens=200, output_tokens=10),
        ],
    )
    workload = dump_workload([too_long, fine], tmp_path / "long.jsonl")
    run = _emulate(tmp_path, workload, "continuum", pool=6000)  # the context length is the pool: 6,000
    long_rec, fine_rec = run["replay"]["programs"]
    assert [t["error"] is None for t in long_rec["turns"]] == [True, False]  # the third turn is never sent
    assert "aborted by the scheduler" in long_rec["turns"][1]["error"]
    assert not long_rec["ok"] and long_rec["jct"] is None
    assert fine_rec["ok"] and all(t["error"] is None for t in fine_rec["turns"])
    accounting = run["emulator"]["pool_after"]
    assert accounting["available"] + accounting["evictable"] + accounting["protected"] == 6000


def test_hicache_an_expired_pins_prefix_comes_back_from_host_and_its_step_pays_the_transfer(tmp_path):
    """Program p's turn 1 (3000 tokens) is pinned for 0.2 s; three 5000-token requests need the
    pool (8000) and push its prefix off the device once the pin is gone, so Continuum backs it up
    to a protected host copy. Turn 2 (3 s later) loads it back: its prefill step takes the
    profile's extend time plus the host-to-device transfer of what was loaded."""
    programs = [
        Program(
            program_id="p",
            turns=[
                Turn(append_tokens=3000, output_tokens=4, tool="bash", tool_duration_s=3.0),
                Turn(append_tokens=100, output_tokens=4),
            ],
        ),
        *(Program(program_id=f"f{i}", turns=[Turn(append_tokens=5000, output_tokens=4)]) for i in range(3)),
    ]
    workload = dump_workload(programs, tmp_path / "offload.jsonl")
    env = tuple(f"{k}={v}" for k, v in fixed_ttl_env(0.2).items())
    run = _emulate(tmp_path, workload, "continuum+hicache", pool=8000, jps=10.0, seed=1, env=env)
    model = StepLatencyModel.load(_profile(tmp_path))
    host = run["emulator"]["host_transfers"]
    assert _series(run, "sglang:continuum_offloads_total") == 1
    assert _series(run, "sglang:continuum_host_hits_total") == 1
    loaded = host["loaded_tokens"]
    assert loaded == _series(run, "sglang:load_back_tokens_total") >= 3000  # SGLang's own count agrees
    assert host["written_tokens"] >= 3000  # p's context went to host (write-through at insert)
    load_s = loaded * 131072 / 1e10
    assert host["load_s"] == pytest.approx(load_s, rel=1e-12)
    p = next(r for r in run["replay"]["programs"] if r["program_id"] == "p")
    t2 = p["turns"][1]
    assert t2["cached_tokens"] >= loaded and t2["queue_time_s"] == 0.0
    assert t2["cached_host_tokens"] == loaded  # the turn's cached prefix by tier
    prompt, cached = t2["prompt_tokens"], t2["cached_tokens"]
    expected = (
        model.prefill_seconds([(prompt - cached, cached)])
        + load_s
        + sum(model.decode_seconds(1, prompt + k) for k in range(1, 4))
    )
    assert t2["finish"] - t2["send"] == pytest.approx(expected, rel=1e-9)


def test_hicache_size_is_translated_to_the_same_host_pool_in_tokens():
    from continuum_lab.emulator.sglang_engine import hicache_flags

    flags = hicache_flags(["--hicache-size", "200", "--hicache-ratio", "2"], 454188, 131072)
    assert flags[:-1] == ["--hicache-ratio"]
    assert float(flags[-1]) * 454188 * 131072 == pytest.approx(200e9)
    # no size and no ratio: SGLang's default ratio, explicitly (not sized from this machine's free memory)
    assert hicache_flags(["--chunked-prefill-size", "8192"], 1000, 1) == [
        "--chunked-prefill-size",
        "8192",
        "--hicache-ratio",
        "2.0",
    ]
    assert hicache_flags(["--hicache-ratio", "3"], 1000, 1) == ["--hicache-ratio", "3"]


def test_bench_sessions_keeps_n_sessions_in_flight_and_reports_the_window(tmp_path):
    """The field's protocol: N sessions at once, a session that ends replaced at once by the next
    of the trace (later passes renamed), gaps capped, figures over the window after the warm-up;
    ``+hicache-write-back`` reaches SGLang as its write policy."""
    from continuum_lab.cli.bench import main

    trace = [
        Program(
            program_id=f"p{i}",
            turns=[
                Turn(append_tokens=400 + 100 * i, output_tokens=8, tool="bash", tool_duration_s=30.0),
                Turn(append_tokens=50, output_tokens=8),
            ],
        )
        for i in range(3)
    ]
    workload = dump_workload(trace, tmp_path / "trace.jsonl")
    out = tmp_path / "sessions"
    rc = main(
        [
            "--emulate", str(_profile(tmp_path)), "--workload", str(workload), "--policies", "fcfs+hicache-write-back",
            "--sessions", "2", "--window-s", "20", "--warmup-s", "5", "--max-gap-s", "1", "--max-total-tokens", "4000",
            "--seeds", "1", "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert [(r["policy"], r["sessions"]) for r in report["rows"]] == [("fcfs+hicache-write-back", 2)]
    # the clients gave up as the OpenAI SDK's do unless told otherwise, and the report says so
    assert (report["protocol"]["client_timeout_s"], report["protocol"]["client_retries"]) == (600.0, 2)
    assert report["rows"][0]["timeouts"] == 0 and "gives up on a try after 600 s" in (out / "report.md").read_text()
    for n in (2,):
        run = json.loads((out / "runs" / f"fcfs+hicache-write-back-n{n}-s1-r0.json").read_text())
        assert "--hicache-write-policy write_back" in run["emulator"]["server_argv"]
        assert (run["replay"]["client_timeout_s"], run["replay"]["client_retries"]) == (600.0, 2)
        programs = run["replay"]["programs"]
        assert len(programs) > 3 and any(p["program_id"].endswith(".1") for p in programs)  # the trace cycled
        ends = sorted(p["end"] for p in programs if p["end"] is not None)
        starts = sorted(p["start"] for p in programs[n:])
        assert starts == ends[: len(starts)]  # each new session started when one ended
        for p in programs:  # every gap capped at 1 s
            turns = p["turns"]
            assert all(b["send"] - a["finish"] == pytest.approx(1.0) for a, b in zip(turns, turns[1:]))
        figures = run["sessions"]["figures"]
        assert figures["turns_finished"] > 0 and figures["output_tokens_per_s"] > 0
        assert figures["turns_per_session_hour"] == pytest.approx(figures["turns_finished"] / (n * 20 / 3600))
    assert "**Emulated, predictions**" in (out / "report.md").read_text()


def test_the_real_schedulers_runs_split_the_reprefill_by_what_became_of_each_pin(tmp_path):
    """Continuum on SGLang's scheduler: every return in the window is named by what became of its
    program's pin (the plugin's event log), and the split adds up to the window's re-prefill."""
    from continuum_lab.cli.bench import main

    workload = _agents(tmp_path, programs=4, append_tokens=500, gaps=(1.0, 3.0, 1.0, 3.0))
    out = tmp_path / "split"
    rc = main(  # pins of 2 s: a 1 s tool comes back to its pin, a 3 s one after it expired
        [
            "--emulate", str(_profile(tmp_path)), "--workload", str(workload), "--policies", "continuum-fixed",
            "--sessions", "4", "--window-s", "30", "--warmup-s", "5", "--max-total-tokens", "4000",
            "--seeds", "1", "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    run = json.loads((out / "runs" / "continuum-fixed-n4-s1-r0.json").read_text())
    figures = run["sessions"]["figures"]
    split = figures["returns_by_pin_end"]
    assert set(split) <= {"pinned", "none", "refused", "expired", "released", "flushed", "unknown"} | {
        f"shed-{reason}" for reason in ("admission", "idle", "alloc", "budget", "stale")
    }
    assert split["pinned"]["returns"] > 0 and split["pinned"]["lost"] == 0 and split["expired"]["returns"] > 0
    assert "unknown" not in split  # every return has its record
    assert sum(v["tokens"] for v in split.values()) == figures["reprefilled_tokens"]
    assert "Where the re-prefill came from" in (out / "report.md").read_text()


def test_a_bench_killed_mid_run_leaves_no_emulated_run_behind(tmp_path):
    """Runs are forked by a fork server, not by the bench: a bench stopped by a signal must take
    them down, or they go on computing on the cores the next benchmark measures with."""
    import contextlib
    import signal
    import time

    import psutil

    workload = _agents(tmp_path, programs=3, append_tokens=300, gaps=(1.0, 1.0, 1.0))
    out = tmp_path / "bench"
    cmd = [
        sys.executable, "-m", "continuum_lab.cli.bench", "--emulate", str(_profile(tmp_path)), "--workload",
        str(workload), "--policies", "fcfs", "--sessions", "4", "--window-s", "1000000", "--warmup-s", "0",
        "--max-total-tokens", "4000", "--seeds", "1", "--out", str(out),
    ]  # fmt: skip
    bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spawned: list[psutil.Process] = []
    try:
        log = out / "runs" / "fcfs-n4-s1-r0.log"
        deadline = time.monotonic() + 120
        while not log.is_file():  # the run was forked (its target opened its log)
            assert bench.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.2)
        spawned = psutil.Process(bench.pid).children(recursive=True)
        assert spawned  # the fork server and the run
        bench.send_signal(signal.SIGKILL)
        bench.wait()
        _, alive = psutil.wait_procs(spawned, timeout=15)
        assert not alive, [p.cmdline()[:4] for p in alive]
    finally:
        bench.kill()
        for p in spawned:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
