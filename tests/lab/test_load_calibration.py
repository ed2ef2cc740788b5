"""continuum-bench --jps auto / --load X: the calibration arithmetic (pure) and the CLI's parsing."""

import json
from pathlib import Path

import pytest

from continuum_lab.bench.calibrate import (
    DEFAULT_LOAD,
    Calibration,
    calibrate,
    calibrated_jps,
    parse_load,
    predicted_seconds,
    prefill_rate,
    probe_lengths,
    program_prompt_tokens,
    program_tool_seconds,
    scale_tools,
    tool_scale,
    turn_prompts,
)
from continuum_lab.workloads.schema import Program

ROOT = Path(__file__).resolve().parents[2]
DEMO_WORKLOAD = ROOT / "workloads" / "swe-cpu-prefill-72-small.jsonl"


def program(pid: str, turns: list[tuple[int, int]]) -> Program:
    return Program.model_validate(
        {
            "program_id": pid,
            "turns": [
                {"append_tokens": a, "output_tokens": o, "tool": "bash" if i < len(turns) - 1 else None}
                | ({"tool_duration_s": 1.0} if i < len(turns) - 1 else {})
                for i, (a, o) in enumerate(turns)
            ],
        }
    )


def test_a_turns_prompt_is_the_whole_context_the_replay_sends():
    p = program("a", [(100, 5), (50, 5), (20, 1)])
    assert turn_prompts(p) == [100, 155, 180]  # 100; +5 out +50; +5 out +20
    q = program("b", [(300, 10)])
    assert program_prompt_tokens([p, q]) == (435 + 300) / 2


def test_probe_lengths_are_token_weighted_quantiles_of_the_turn_prompts():
    # prompts 100 and 900: 90% of the tokens lie in the 900-token prompt
    p = program("a", [(100, 1), (799, 1)])
    assert probe_lengths([p], (0.05, 0.5, 0.95)) == [100, 900, 900]
    with pytest.raises(ValueError):
        probe_lengths([p], (0.0,))


def test_rate_and_jps_arithmetic():
    assert prefill_rate([(1000, 0.1), (3000, 0.3)]) == pytest.approx(10_000.0)
    # 10,000 tokens/s over 20,000 tokens a program: 0.5 programs/s; a load of 8 is 4 programs/s
    assert calibrated_jps(8.0, 10_000.0, 20_000.0) == pytest.approx(4.0)
    for bad in [(0.0, 1.0, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, -1.0)]:
        with pytest.raises(ValueError):
            calibrated_jps(*bad)
    with pytest.raises(ValueError):
        prefill_rate([(1000, 0.0)])


def test_a_machine_twice_as_fast_is_offered_twice_the_programs_per_second():
    p = program("a", [(1000, 1), (999, 1)])  # prompts 1000 and 2000: 3000 tokens a program
    slow = calibrate([p], 6.0, lambda lengths: [n / 5_000 for n in lengths], "slow")
    fast = calibrate([p], 6.0, lambda lengths: [n / 10_000 for n in lengths], "fast")
    assert slow.tokens_per_program == 3000 and slow.rate_tokens_s == pytest.approx(5_000)
    assert slow.jps == pytest.approx(10.0) and fast.jps == pytest.approx(20.0)
    text = slow.reason()
    assert "load 6x" in text and "5,000 tokens/s" in text and "10 programs/s" in text
    assert json.loads(json.dumps(slow.to_dict()))["jps"] == pytest.approx(10.0)


def test_tool_times_scale_with_the_machine_under_a_tool_ratio():
    p = program("a", [(1000, 1), (999, 1)])  # 3000 tokens, 1 s of tools
    assert program_tool_seconds([p]) == 1.0
    # 3000 tokens at 5,000 tokens/s: 0.6 s of prefill; a ratio of 2 wants 1.2 s of tools
    assert tool_scale(2.0, 0.6, 1.0) == pytest.approx(1.2)
    with pytest.raises(ValueError):
        tool_scale(2.0, 0.6, 0.0)  # a workload without tools has nothing to scale
    slow = calibrate([p], 6.0, lambda lengths: [n / 5_000 for n in lengths], "slow", tool_ratio=2.0)
    fast = calibrate([p], 6.0, lambda lengths: [n / 10_000 for n in lengths], "fast", tool_ratio=2.0)
    assert slow.tool_scale == pytest.approx(1.2) and fast.tool_scale == pytest.approx(0.6)
    assert "tool times x1.2" in slow.reason()
    assert calibrate([p], 6.0, lambda lengths: [n / 5_000 for n in lengths], "x").tool_scale == 1.0
    (q,) = scale_tools([p], 0.5)
    assert [t.tool_duration_s for t in q.turns] == [0.5, 0.0] and q.turns[1].append_tokens == 999
    assert p.turns[0].tool_duration_s == 1.0  # the original is left alone


def test_the_emulator_probes_with_the_profiles_prediction():
    from continuum_lab.emulator.step_model import StepLatencyModel

    base = StepLatencyModel(prefill=(0.01, 1e-5, 1e-9), decode=(0.001, 0.0, 0.0))
    double = StepLatencyModel(prefill=(0.02, 2e-5, 2e-9), decode=(0.002, 0.0, 0.0))
    p = program("a", [(500, 5), (1500, 5)])
    one = calibrate([p], DEFAULT_LOAD, predicted_seconds(base), "x1")
    two = calibrate([p], DEFAULT_LOAD, predicted_seconds(double), "x2")
    assert one.points[0][1] == pytest.approx(0.01 + 1e-5 * one.points[0][0] + 1e-9 * one.points[0][0] ** 2)
    assert two.jps == pytest.approx(one.jps / 2, rel=0.02)  # every step twice as slow: half the load


def test_the_demo_workloads_calibration_at_the_reference_profile():
    """The demo's 30 programs on the profile of the machine the demo's regime came from (the
    arithmetic the README's figures rest on)."""
    from continuum_lab.emulator.step_model import StepLatencyModel
    from continuum_lab.workloads.schema import load_workload

    programs = load_workload(DEMO_WORKLOAD)[:30]
    latency = StepLatencyModel.load(ROOT / "configs" / "profiles" / "cpu-tiny-llama-bench.json")
    cal = calibrate(programs, 1.0, predicted_seconds(latency), latency.name)
    assert [n for n, _ in cal.points] == [884, 1537, 1892, 2344, 2907]
    assert cal.tokens_per_program == pytest.approx(15191, abs=1)
    assert cal.rate_tokens_s == pytest.approx(16_924, rel=0.001)
    assert isinstance(cal, Calibration) and 5.0 / cal.service_rate == pytest.approx(4.49, abs=0.01)


@pytest.mark.parametrize(
    "jps, load, expected",
    [
        ("0.5", None, ([0.5], None)),
        ("0.25,0.5,1", None, ([0.25, 0.5, 1.0], None)),
        ("auto", None, ([], DEFAULT_LOAD)),
        ("AUTO", 6.0, ([], 6.0)),
        ("", 6.0, ([], 6.0)),
    ],
)
def test_parse_load(jps, load, expected):
    assert parse_load(jps, load) == expected


@pytest.mark.parametrize("jps, load", [("5", 6.0), ("auto,5", None), ("auto", 0.0), ("auto", -1.0), ("", None)])
def test_parse_load_refuses(jps, load):
    with pytest.raises(ValueError):
        parse_load(jps, load)


def _bench(argv):
    from continuum_lab.cli import bench

    return bench.main(["--workload", str(DEMO_WORKLOAD), "--programs", "30", "--pool-programs", "6", *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ["--jps", "5", "--load", "6"],
        ["--jps", "auto,1"],
        ["--jps", "auto", "--sessions", "8"],
        ["--load", "0"],
        ["--jps", "5", "--tool-ratio", "2"],
        ["--jps", "auto", "--tool-ratio", "0"],
    ],
)
def test_bench_cli_refuses(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        _bench([*argv, "--emulate", "configs/profiles/cpu-tiny-llama-bench.json", "--out", str(tmp_path)])
    assert exc.value.code == 2


class _Stop(Exception):
    pass


def test_bench_cli_emulated_auto_load_runs_the_grid_at_the_calibrated_jps(tmp_path, monkeypatch, capsys):
    from continuum_lab.cli import bench

    seen = {}

    def fake_runs(grid, args, pool, env):
        seen["grid"] = grid
        raise _Stop

    monkeypatch.setattr(bench, "_emulated_runs", fake_runs)
    profile = ROOT / "configs" / "profiles" / "cpu-tiny-llama-bench.json"
    with pytest.raises(_Stop):
        _bench(["--emulate", str(profile), "--jps", "auto", "--load", "4.5", "--seeds", "1,2", "--out", str(tmp_path)])
    jps = {cell[2] for cell in seen["grid"]}
    # 4.5 x 16,924 tokens/s / 15,191 tokens a program = 5.01 programs/s: the demo's old 5/s on that machine
    assert len(seen["grid"]) == 8 and jps == {5.01}  # 4 default policies x 2 seeds
    out = capsys.readouterr().out
    assert "[load] 5.01 programs/s: load 4.5x" in out


def test_bench_cli_emulated_tool_ratio_runs_a_workload_with_scaled_tools(tmp_path, monkeypatch, capsys):
    from continuum_lab.cli import bench
    from continuum_lab.workloads.schema import load_workload

    seen = {}

    def fake_runs(grid, args, pool, env):
        seen["workload"] = args.run_workload
        raise _Stop

    monkeypatch.setattr(bench, "_emulated_runs", fake_runs)
    profile = ROOT / "configs" / "profiles" / "cpu-tiny-llama-bench.json"
    with pytest.raises(_Stop):
        _bench(["--emulate", str(profile), "--load", "4.5", "--tool-ratio", "1.5", "--out", str(tmp_path)])
    original = load_workload(DEMO_WORKLOAD)[:30]
    scaled = load_workload(seen["workload"])
    assert len(scaled) == 30
    # 15,191 tokens at 16,924 tokens/s: 0.898 s of prefill a program; 1.5 x that over 3.00 s of tools
    factor = 1.5 * (15_191 / 16_924) / program_tool_seconds(original)
    assert program_tool_seconds(scaled) == pytest.approx(factor * program_tool_seconds(original), rel=0.01)
    assert [t.append_tokens for t in scaled[0].turns] == [t.append_tokens for t in original[0].turns]
    assert "tool times x0.449" in capsys.readouterr().out


def test_demo_summary_says_which_load_it_chose_and_why(tmp_path):
    from continuum_lab.cli.demo import part_summary

    row = {
        "policy": "fcfs", "jps": 2.5, "jct_mean_median_s": 30.0, "jct_mean_p25_s": 29.0, "jct_mean_p75_s": 31.0,
        "jct_mean_worst_s": 32.0, "cache_hit_median": 0.2, "ratio_vs_fcfs_per_run": [1.0, 1.0],
        "ratio_vs_fcfs_median": 1.0, "collapsed_runs": 0,
    }  # fmt: skip
    report = {
        "workload": "w.jsonl",
        "programs": 30,
        "seeds": [1, 2],
        "kv_pool_tokens": 15335,
        "across_seeds": [
            row,
            row | {"policy": "continuum", "ratio_vs_fcfs_median": 1.4, "ratio_vs_fcfs_per_run": [1.3, 1.5]},
        ],
        "runs": [],
        "calibration": {"reason": "load 4.5x: the server at X prefilled 8,000 tokens/s"},
    }
    text = "\n".join(part_summary(report))
    assert "30 programs at 2.5 programs/s" in text
    assert "load chosen by measuring this machine (--jps auto): load 4.5x: the server at X prefilled" in text
    del report["calibration"]
    assert "load chosen" not in "\n".join(part_summary(report))


def test_bench_cli_refuses_a_tool_ratio_for_a_workload_without_tool_time(tmp_path):
    from continuum_lab.cli import bench
    from continuum_lab.workloads.schema import dump_workload

    path = dump_workload([program("a", [(100, 1), (50, 1)]).model_copy(update={"turns": [
        t.model_copy(update={"tool_duration_s": 0.0}) for t in program("a", [(100, 1), (50, 1)]).turns
    ]})], tmp_path / "w.jsonl")  # fmt: skip
    profile = ROOT / "configs" / "profiles" / "cpu-tiny-llama-bench.json"
    with pytest.raises(SystemExit) as exc:
        bench.main(
            [
                "--workload",
                str(path),
                "--emulate",
                str(profile),
                "--load",
                "4",
                "--tool-ratio",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
    assert exc.value.code == 2


def test_the_probe_times_fresh_prefills_then_flushes_the_cache(capsys):
    """``AutoLoad`` against a stand-in server: one warm-up and ``PROBE_REPEATS`` prompts of each
    length, fresh ids each time, then ``/flush_cache``; the tool times follow the measured rate."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from continuum_lab.bench.calibrate import PROBE_REPEATS, AutoLoad

    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            calls.append((self.path, json.loads(body) if body else None))
            out = b'{"text": "x"}' if self.path == "/generate" else b"Cache flushed."
            self.send_response(200)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        programs = [program("a", [(300, 1), (1200, 1)]), program("b", [(600, 1), (600, 1)])]
        auto = AutoLoad(programs, 3.0, 1.0, vocab=500)
        cal = auto(f"http://127.0.0.1:{server.server_port}", "the stand-in")
        assert auto(None) is cal  # once per command
    finally:
        server.shutdown()
    lengths = [n for n, _ in cal.points]
    generates = [body for path, body in calls if path == "/generate"]
    assert [path for path, _ in calls][-1] == "/flush_cache" and len(generates) == len(lengths) * (PROBE_REPEATS + 1)
    assert [len(b["input_ids"]) for b in generates[:: PROBE_REPEATS + 1]] == lengths
    assert all(b["sampling_params"] == {"max_new_tokens": 1} for b in generates)
    assert len({tuple(b["input_ids"]) for b in generates}) == len(generates)  # nothing cached between them
    assert cal.source == "the stand-in" and cal.jps > 0
    scaled = program_tool_seconds(auto.programs)
    assert scaled == pytest.approx(cal.prefill_s_per_program, rel=0.01)  # a tool ratio of 1
    assert "[load]" in capsys.readouterr().out
