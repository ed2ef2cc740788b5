"""The fixed-concurrency protocol (``bench/sessions.py``) and its report (``bench/sessions_report.py``)."""

from itertools import islice

import pytest

from continuum_lab.bench.replay import ProgramRecord, ReplayResult, TurnRecord
from continuum_lab.bench.sessions import SessionsProtocol, session_programs, window_figures
from continuum_lab.bench.sessions_report import aggregate, best_stock, markdown, plots
from continuum_lab.workloads.schema import Program, Turn


def _program(name, gaps):
    turns = [Turn(append_tokens=10, output_tokens=5, tool="bash", tool_duration_s=g) for g in gaps]
    return Program(program_id=name, turns=[*turns, Turn(append_tokens=10, output_tokens=5)])


def test_sessions_cycle_the_trace_renaming_later_passes_and_capping_gaps():
    trace = [_program("a", [3.0, 40.0]), _program("b", [0.5])]
    first = [p.program_id for p in islice(session_programs(trace, seed=7), 6)]
    assert (
        sorted(first[:2]) == ["a", "b"] and sorted(first[2:4]) == ["a.1", "b.1"] and sorted(first[4:]) == ["a.2", "b.2"]
    )
    assert first == [p.program_id for p in islice(session_programs(trace, seed=7), 6)]  # the seed fixes the order
    capped = {p.program_id: p for p in islice(session_programs(trace, seed=7, max_gap_s=10.0), 2)}
    assert [t.tool_duration_s for t in capped["a"].turns] == [3.0, 10.0, 0.0]
    assert [t.tool_duration_s for t in trace[0].turns] == [3.0, 40.0, 0.0]  # the trace itself is untouched
    raw = {p.program_id: p for p in islice(session_programs(trace, seed=7), 2)}
    assert [t.tool_duration_s for t in raw["a"].turns] == [3.0, 40.0, 0.0]


def test_protocol_rejects_what_cannot_be_measured():
    with pytest.raises(ValueError, match="concurrency"):
        SessionsProtocol(0, 60.0)
    with pytest.raises(ValueError, match="window"):
        SessionsProtocol(4, 0.0)
    with pytest.raises(ValueError, match="max-gap"):
        SessionsProtocol(4, 60.0, max_gap_s=-1.0)
    assert SessionsProtocol(4, 60.0, ramp_s=8.0).start_times() == [0.0, 2.0, 4.0, 6.0]


def _turn(program, i, send, first, finish, prompt, cached, host=0, out=10, queue=0.0):
    return TurnRecord(program, i, send=send, first_token=first, finish=finish, prompt_tokens=prompt,
                      cached_tokens=cached, cached_host_tokens=host, output_tokens=out, queue_time_s=queue)  # fmt: skip


def test_window_figures_count_only_the_window_and_a_waiting_turn_with_its_wait_so_far():
    protocol = SessionsProtocol(concurrency=2, window_s=100.0, warmup_s=10.0)
    a = ProgramRecord("a", 0.0, start=0.0, turns=[
        _turn("a", 0, 0.0, 1.0, 2.0, prompt=1000, cached=0),  # warm-up: not counted
        _turn("a", 1, 20.0, 21.0, 25.0, prompt=1100, cached=1010, host=300),  # 1,010 = all of turn 0's context
        _turn("a", 2, 30.0, 33.0, 40.0, prompt=1200, cached=110, queue=3.0),  # 1,000 of 1,110 re-prefilled
    ])  # fmt: skip
    b = ProgramRecord("b", 5.0, start=5.0, turns=[
        _turn("b", 0, 5.0, 6.0, 15.0, prompt=500, cached=0),  # sent in the warm-up, finished in the window
        TurnRecord("b", 1, send=80.0, prompt_tokens=600),  # still waiting at 110 s: 30 s and counting
    ])  # fmt: skip
    c = ProgramRecord("c", 2.0, start=2.0, turns=[TurnRecord("c", 0, send=2.0, prompt_tokens=800)])  # parked all along
    f = window_figures(
        ReplayResult([a, b, c], 110.0),
        protocol,
        {"start": {"host_loaded_tokens": 50}, "end": {"host_loaded_tokens": 350}},
    )
    assert f["turns_finished"] == 3 and f["turns_sent"] == 3  # a1, a2, b1 sent; a1, a2, b0 finished
    assert f["output_tokens_per_s"] == pytest.approx(30 / 100.0)
    assert f["turns_per_session_hour"] == pytest.approx(3 / (2 * 100 / 3600))
    assert f["prompt_tokens"] == 1100 + 1200 + 500
    assert f["cached_host_tokens"] == 300 and f["cached_device_tokens"] == 1010 + 110 - 300
    assert f["reprefilled_tokens"] == 0 + (1110 - 110)
    assert f["ttft_max_s"] == pytest.approx(30.0)  # b1 never got its first token: it waited 30 s by the end
    assert f["longest_later_turn_wait_s"] == pytest.approx(30.0)
    # c's first turn, sent in the warm-up and never admitted, waited the whole run: a parked session counts
    assert f["longest_first_turn_wait_s"] == pytest.approx(108.0) and f["longest_wait_s"] == pytest.approx(108.0)
    assert f["first_turns_waiting_at_end"] == 1
    assert f["longest_program_wait_s"] == pytest.approx(108.0)  # c; a waited 0 + 3 s, b 30 s
    assert f["host_loaded_tokens_in_window"] == 300
    # time averages over [10, 110): a admitted from 1 s and b from 6 s, neither ended (100 s each); c
    # never; running a1 (21-25 s) and a2 (33-40 s), b0 for 5 of its 9 s; b1 waits its last 30 s
    assert f["sessions_admitted_mean"] == pytest.approx(2.0)
    assert f["turns_running_mean"] == pytest.approx((4 + 7 + 5) / 100)
    assert f["running_turn_prompt_tokens"] == pytest.approx((4 * 1100 + 7 * 1200 + 5 * 500) / 16)
    assert f["returning_turns_waiting_mean"] == pytest.approx((1 + 3 + 30) / 100)
    # admitted sessions' contexts over [10, 110): a 1,010 to 21 s, 1,100 to 25 s, 1,110 to 33 s, 1,200
    # to 40 s, then 1,210; b 500 to 15 s, then 510 (its waiting return keeps it); c never admitted
    a_ctx = 1010 * 11 + 1100 * 4 + 1110 * 8 + 1200 * 7 + 1210 * 70
    assert f["admitted_context_tokens_mean"] == pytest.approx((a_ctx + 500 * 5 + 510 * 95) / 100)
    assert f["admitted_context_tokens_peak"] == 1210 + 510  # no spike where a turn's context becomes the next's


def test_a_programs_wait_is_its_turns_waits_in_the_window_summed():
    protocol = SessionsProtocol(concurrency=2, window_s=100.0, warmup_s=10.0)
    # a parked at each of three turn boundaries for 20 s: no single wait is long, the program's is
    a = ProgramRecord("a", 0.0, start=0.0, turns=[
        _turn("a", 0, 0.0, 1.0, 2.0, prompt=100, cached=0, queue=1.0),  # admitted in the warm-up: not counted
        *(_turn("a", i, 20.0 * i, 20.0 * i + 20.0, 20.0 * i + 21.0, prompt=100, cached=0, queue=20.0)
          for i in (1, 2, 3)),
    ])  # fmt: skip
    b = ProgramRecord("b", 0.0, start=0.0, turns=[_turn("b", 0, 30.0, 65.0, 66.0, prompt=100, cached=0, queue=35.0)])
    f = window_figures(ReplayResult([a, b], 110.0), protocol)
    assert f["longest_wait_s"] == pytest.approx(35.0)  # b's one turn
    assert f["ttft_p90_first_turns_s"] == pytest.approx(35.0)  # b's first turn, the one sent in the window
    assert f["ttft_p90_later_turns_s"] == pytest.approx(20.0)
    assert f["longest_program_wait_s"] == pytest.approx(60.0)  # a's three
    assert f["program_wait_p90_s"] == pytest.approx(35.0 + 0.9 * 25.0)


def _run(policy, n, seed, tps, p90=1.0):
    figures = {"output_tokens_per_s": tps, "ttft_p90_s": p90, "longest_wait_s": 2.0}
    return {"policy": policy, "sessions": n, "seed": seed, "figures": figures}


def test_report_compares_with_the_best_stock_policy_on_the_same_tiers_seed_by_seed():
    runs = [
        *(_run("fcfs", 16, s, 100.0) for s in (1, 2)),
        *(_run("lpm", 16, s, 110.0) for s in (1, 2)),
        _run("fcfs+hicache", 16, 1, 150.0), _run("fcfs+hicache", 16, 2, 150.0),
        _run("lpm+hicache-write-back", 16, 1, 160.0), _run("lpm+hicache-write-back", 16, 2, 200.0),
        _run("continuum", 16, 1, 121.0), _run("continuum", 16, 2, 99.0),
        _run("continuum+hicache", 16, 1, 240.0), _run("continuum+hicache", 16, 2, 240.0),
    ]  # fmt: skip
    assert best_stock(runs, "continuum", 16) == "lpm"
    assert best_stock(runs, "continuum+hicache", 16) == "lpm+hicache-write-back"  # either write policy
    rows = {r["policy"]: r for r in aggregate(runs)}
    assert rows["continuum"]["vs_best_stock_median"] == pytest.approx((1.1 + 0.9) / 2)
    assert rows["continuum"]["vs_best_stock_worst"] == pytest.approx(0.9)
    assert rows["continuum+hicache"]["vs_best_stock_median"] == pytest.approx((1.5 + 1.2) / 2)
    assert rows["continuum+hicache"]["vs_best_stock_worst"] == pytest.approx(1.2)
    assert rows["fcfs+hicache"]["vs_fcfs_no_host_median"] == pytest.approx(1.5)  # the host tier's own gain
    table = markdown(list(rows.values()))
    assert "host tier alone: 1.50x fcfs" in table and "1.35x (1.20x) vs lpm+hicache-write-back" in table


def test_plots_are_drawn_against_n_and_only_for_a_sweep(tmp_path):
    # a grid at one N drew two charts of one point per policy, which report.md then linked
    one_n = aggregate([_run("fcfs", 96, 1, 100.0), _run("continuum", 96, 1, 120.0)])
    assert plots(one_n, tmp_path) == [] and not list(tmp_path.iterdir())
    sweep = aggregate([_run(p, n, 1, 100.0 + n) for p in ("fcfs", "continuum") for n in (16, 96)])
    assert [p.name for p in plots(sweep, tmp_path)] == ["throughput.png", "ttft-p90.png"]
    assert all(p.stat().st_size > 0 for p in tmp_path.iterdir())


def test_the_doors_holds_give_the_longest_park_and_pause_from_the_plugins_admission_records():
    """A first turn the door held is parked, a later one paused; a turn that waited in the queue
    without being held is neither, and a run without the plugin's records reports none."""
    from continuum_lab.bench.sessions import held_back_turns

    protocol = SessionsProtocol(concurrency=2, window_s=100.0, warmup_s=10.0)
    a = ProgramRecord("a", 12.0, start=12.0, turns=[
        _turn("a", 0, 12.0, 52.0, 53.0, prompt=100, cached=0, queue=40.0),  # parked 40 s
        _turn("a", 1, 60.0, 85.0, 86.0, prompt=200, cached=0, queue=25.0),  # paused 25 s
    ])  # fmt: skip
    b = ProgramRecord("b", 12.0, start=12.0, turns=[
        _turn("b", 0, 12.0, 13.0, 14.0, prompt=100, cached=0),
        _turn("b", 1, 20.0, 70.0, 71.0, prompt=200, cached=0, queue=50.0),  # queued 50 s, never held
    ])  # fmt: skip
    records = [  # the plugin's: turns counted from 1
        {"event": "admitted", "program_id": "a", "turn": 1, "held_back": True},
        {"event": "admitted", "program_id": "a", "turn": 2, "held_back": True},
        {"event": "admitted", "program_id": "b", "turn": 1, "held_back": False},
        {"event": "admitted", "program_id": "b", "turn": 2, "held_back": False},
        {"event": "admitted", "program_id": None, "turn": 1, "held_back": True},  # no program: never parked
    ]
    held = held_back_turns(records)
    assert held == [("a", 0), ("a", 1)]
    f = window_figures(ReplayResult([a, b], 110.0), protocol, held_back=held)
    assert f["longest_park_s"] == pytest.approx(40.0)
    assert f["longest_pause_s"] == pytest.approx(25.0) and f["turns_paused"] == 1
    assert f["longest_later_turn_wait_s"] == pytest.approx(50.0)  # b's queueing is not a pause
    plain = window_figures(ReplayResult([a, b], 110.0), protocol)
    assert "longest_pause_s" not in plain and "turns_paused" not in plain


def test_the_reprefill_is_split_by_what_became_of_each_returns_pin():
    """The plugin names, for each returning turn, what became of its program's pin; the window's
    re-prefill is split by it (a return without a record is "unknown"), and it adds up."""
    from continuum_lab.bench.sessions import pin_ends

    protocol = SessionsProtocol(concurrency=2, window_s=100.0, warmup_s=10.0)
    a = ProgramRecord("a", 0.0, start=0.0, turns=[
        _turn("a", 0, 11.0, 12.0, 13.0, prompt=1000, cached=0),
        _turn("a", 1, 20.0, 21.0, 25.0, prompt=1100, cached=1010),  # hit
        _turn("a", 2, 30.0, 33.0, 40.0, prompt=1200, cached=110),  # 1,000 of 1,110 gone: shed
        _turn("a", 3, 50.0, 51.0, 52.0, prompt=1300, cached=1000),  # 210 of 1,210 gone: expired
    ])  # fmt: skip
    b = ProgramRecord("b", 5.0, start=5.0, turns=[
        _turn("b", 0, 11.0, 12.0, 13.0, prompt=500, cached=0),
        _turn("b", 1, 20.0, 21.0, 22.0, prompt=600, cached=0),  # all 510 gone, no record
    ])  # fmt: skip
    records = [  # the plugin's: turns counted from 1; a first turn has no pin_end
        {"event": "admitted", "program_id": "a", "turn": 1, "pin_end": None},
        {"event": "admitted", "program_id": "a", "turn": 2, "pin_end": "pinned"},
        {"event": "admitted", "program_id": "a", "turn": 3, "pin_end": "shed-admission"},
        {"event": "admitted", "program_id": "a", "turn": 4, "pin_end": "expired"},
    ]
    ended = pin_ends(records)
    assert ended == [("a", 1, "pinned"), ("a", 2, "shed-admission"), ("a", 3, "expired")]
    f = window_figures(ReplayResult([a, b], 110.0), protocol, pin_ended=ended)
    assert f["returns_by_pin_end"] == {
        "pinned": {"returns": 1, "lost": 0, "tokens": 0},
        "shed-admission": {"returns": 1, "lost": 1, "tokens": 1000},
        "expired": {"returns": 1, "lost": 0, "tokens": 210},
        "unknown": {"returns": 1, "lost": 1, "tokens": 510},
    }
    assert sum(v["tokens"] for v in f["returns_by_pin_end"].values()) == f["reprefilled_tokens"]
    assert "returns_by_pin_end" not in window_figures(ReplayResult([a, b], 110.0), protocol)
    assert pin_ends([]) is None


def test_the_report_tabulates_the_split_per_plugin_run_only():
    from continuum_lab.bench.sessions_report import pin_end_markdown

    split = {
        "pinned": {"returns": 9, "lost": 0, "tokens": 0},
        "shed-budget": {"returns": 3, "lost": 2, "tokens": 250_000},
    }
    runs = [
        {"policy": "lpm", "sessions": 16, "seed": 1, "figures": {}},
        {"policy": "continuum", "sessions": 16, "seed": 1, "figures": {"returns_by_pin_end": split}},
    ]
    table = pin_end_markdown(runs).splitlines()
    assert table[0] == "| N | policy | seed | pinned | shed-budget |"
    assert table[2] == "| 16 | continuum | 1 | 0 / 9, 0.00 | 2 / 3, 0.25 |" and len(table) == 3
    assert pin_end_markdown(runs[:1]) == ""
