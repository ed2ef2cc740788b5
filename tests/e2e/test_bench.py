"""Tier 3: the replay client and continuum-bench against real CPU servers."""

import json

import pytest

from continuum_lab.bench.replay import replay
from continuum_lab.cli.bench import main as bench_main
from continuum_lab.harness.server import parse_metrics
from continuum_lab.workloads.schema import Program, Turn, dump_workload

pytestmark = pytest.mark.e2e


def tiny_workload(n=3, turns=3):
    return [
        Program(
            program_id=f"prog-{i}",
            turns=[
                Turn(
                    append_tokens=60 + 10 * i,
                    output_tokens=4,
                    tool="bash" if t < turns - 1 else None,
                    tool_duration_s=0.2 if t < turns - 1 else 0.0,
                )
                for t in range(turns)
            ],
        )
        for i in range(n)
    ]


def test_replay_serves_every_turn_in_order_and_the_server_sees_programs(continuum_server):
    before = parse_metrics(continuum_server.metrics())
    result = replay(continuum_server.url, tiny_workload(), jps=4.0, seed=1)
    after = parse_metrics(continuum_server.metrics())
    assert all(p.ok for p in result.programs) and len(result.programs) == 3
    for p in result.programs:
        assert [t.turn for t in p.turns] == [0, 1, 2]
        assert all(a.finish <= b.send for a, b in zip(p.turns, p.turns[1:]))  # in order, after the tool
        assert p.jct == pytest.approx(p.turns[-1].finish - p.turns[0].send)
        # the context grows: previous prompt + output + the new tokens, and it is found cached
        append = 60 + 10 * int(p.program_id.split("-")[1])
        assert [t.prompt_tokens for t in p.turns] == [append, 2 * append + 4, 3 * append + 8]
        assert p.turns[2].cached_tokens >= p.turns[1].prompt_tokens
    created = after["sglang:continuum_pins_created_total"] - before.get("sglang:continuum_pins_created_total", 0)
    hits = after["sglang:continuum_pin_hits_total"] - before.get("sglang:continuum_pin_hits_total", 0)
    assert created == 6 and hits == 6  # two tool gaps per program, each pinned and hit


def test_continuum_bench_end_to_end(tiny_model, tmp_path):
    wl = dump_workload(tiny_workload(n=3, turns=2), tmp_path / "tiny.jsonl")
    out = tmp_path / "bench"
    rc = bench_main(
        [
            "--workload",
            str(wl),
            "--model",
            tiny_model,
            "--policies",
            "fcfs,continuum-ref",
            "--jps",
            "4",
            "--seeds",
            "1",
            "--out",
            str(out),
            "--max-total-tokens",
            "1024",
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    # the grid in run_order (policies innermost, then seed: tests/lab/test_bench_report.py);
    # one seed here, since every run is a server start
    assert [(r["seed"], r["policy"]) for r in report["rows"]] == [(1, "fcfs"), (1, "continuum-ref")]
    assert all(r["failed_requests"] == 0 and r["programs"] == 3 for r in report["rows"])
    assert all(r["pin_hits"] == 0 for r in report["rows"] if r["policy"] == "fcfs")
    assert any(r["pin_hits"] > 0 for r in report["rows"] if r["policy"] == "continuum-ref")
    across = {(a["policy"], a["jps"]): a for a in report["across_seeds"]}
    assert len(across) == 2 and all(a["runs"] == 1 and len(a["ratio_vs_fcfs_per_run"]) == 1 for a in across.values())
    assert across[("fcfs", 4.0)]["ratio_vs_fcfs_median"] == 1.0
    mean = {(r["policy"], r["jps"], r["seed"]): r["summary"]["jct_mean_s"] for r in report["runs"]}
    ref = across[("continuum-ref", 4.0)]
    assert ref["ratio_vs_fcfs_per_run"] == [mean[("fcfs", 4.0, 1)] / mean[("continuum-ref", 4.0, 1)]]
    assert ref["best_stock"] is None  # fcfs is the only stock policy here, and it is the baseline
    assert ref["max_request_wait_worst_s"] >= 0 and ref["p99_request_latency_worst_s"] > 0
    assert all(r["repeat"] == 0 and isinstance(r["collapsed"], bool) for r in report["runs"])
    if report["cpus"]["server"]:  # 2+ cores: every thread of every server stayed off the client's core
        assert all(r["server_cores"] == report["cpus"]["server"] for r in report["runs"])
    md = (out / "report.md").read_text()
    assert "## Across seeds" in md and "| continuum-ref | 4 | 1 |" in md and "| fcfs | 4 | 1 |" in md
    for png in ("jct_cdf.png", "turn_latency.png"):  # the load plot: tests/lab/test_bench_report.py
        assert (out / png).stat().st_size > 1000


def test_a_measured_sessions_grid_keeps_each_runs_records_and_reports_from_them(tiny_model, tmp_path):
    """``continuum-bench --sessions`` on a real server: the report's figures are the ones its kept
    records give (figures defined later can be computed from them, as from an emulated run's)."""
    from continuum_lab.bench.replay import ReplayResult
    from continuum_lab.bench.sessions import SessionsProtocol, window_figures

    wl = dump_workload(tiny_workload(n=4, turns=3), tmp_path / "tiny.jsonl")
    out = tmp_path / "grid"
    args = ["--workload", str(wl), "--model", tiny_model, "--policies", "fcfs", "--seeds", "1", "--sessions", "2"]
    rc = bench_main([*args, "--window-s", "6", "--warmup-s", "2", "--max-total-tokens", "1024", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    run = json.loads((out / "runs" / "fcfs-n2-s1-r0.json").read_text())
    window = run["sessions"]
    figures = window_figures(ReplayResult.from_dict(run["replay"]), SessionsProtocol(**window["protocol"]))
    assert figures["turns_finished"] > 0 and figures["longest_program_wait_s"] is not None
    kept = {k: v for k, v in report["runs"][0]["figures"].items() if not k.endswith("_in_window")}
    assert {k: v for k, v in figures.items() if k in kept} == kept


def test_sessions_keep_n_in_flight_on_a_real_server_and_stop_cleanly_at_the_window(continuum_server):
    """``Replayer.run_sessions``: N sessions at once, each replaced by the next of the trace when it
    ends; at the window's end every turn still in flight is cancelled, and the server (SGLang aborts
    a request whose client went away) is left with nothing running or queued."""
    import asyncio
    import time

    from continuum_lab.bench.replay import Replayer
    from continuum_lab.bench.sessions import SessionsProtocol, session_programs, window_figures

    protocol = SessionsProtocol(concurrency=2, window_s=4.0, warmup_s=0.5, ramp_s=0.2)
    replayer = Replayer(continuum_server.url, seed=3)
    source = session_programs(tiny_workload(n=3, turns=2), seed=3)
    result = asyncio.run(replayer.run_sessions(source, 2, protocol.start_times(), protocol.end_s))
    programs = result.programs
    assert len(programs) > 2  # sessions that ended were replaced
    assert result.wall_s == pytest.approx(protocol.end_s, abs=0.2)
    ends = sorted(p.end for p in programs if p.end is not None)
    starts = sorted(p.planned_arrival for p in programs[2:])
    assert all(s - e == pytest.approx(0.0, abs=0.05) for s, e in zip(starts, ends))  # replaced at once
    for t in (0.25 * k for k in range(1, 18)):  # never more than N sessions in flight
        assert sum(p.planned_arrival <= t and (p.end is None or p.end > t) for p in programs) <= 2
    assert all(t.error is None for p in programs for t in p.turns)
    figures = window_figures(result, protocol)
    assert figures["turns_finished"] > 0 and figures["output_tokens_per_s"] > 0
    live = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = parse_metrics(continuum_server.metrics(), prefix="sglang:")
        if all(m[name] == 0 for name in live):
            break
        time.sleep(0.2)
    assert all(m[name] == 0 for name in live), {name: m[name] for name in live}
