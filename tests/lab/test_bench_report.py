"""continuum-bench's policy flags and report table (pure)."""

import json

from continuum_lab.bench.policies import HICACHE_CPU_FLAGS, context_length, parse_policy
from continuum_lab.bench.report import baseline_of, markdown_table, plots
from continuum_lab.bench.seeds import aggregate, collapsed_flags, headline, run_order, seeds_table


def test_hicache_policies_get_the_host_tier_flags_and_cpu_io_backend():
    args, env = parse_policy("continuum+hicache")
    assert args[:2] == ["--schedule-policy", "continuum"] and "--enable-hierarchical-cache" in args
    assert args[-len(HICACHE_CPU_FLAGS) :] == HICACHE_CPU_FLAGS and env == {}  # the default: nothing to set
    gpu_args, _ = parse_policy("fcfs+hicache", cpu=False)
    assert "--enable-hierarchical-cache" in gpu_args and "direct" not in gpu_args


def test_each_policy_is_compared_with_fcfs_on_the_same_cache_tiers():
    assert baseline_of("continuum") == "fcfs" and baseline_of("continuum+hicache") == "fcfs+hicache"
    assert baseline_of("continuum@round_robin") == "fcfs@round_robin"
    assert baseline_of("continuum+hicache@cache_aware") == "fcfs+hicache@cache_aware"
    rows = [
        {"policy": p, "jps": 1.0, "jct_mean_s": m, "jct_p95_s": 2 * m}
        for p, m in [("fcfs", 10.0), ("continuum", 8.0), ("fcfs+hicache", 6.0), ("continuum+hicache", 4.0)]
    ]
    lines = markdown_table(rows).splitlines()[2:]
    assert [line.split("|")[-3].strip() for line in lines] == ["1.00x", "1.25x", "1.00x", "1.50x"]


def test_runs_interleave_policies_innermost():
    order = run_order(["fcfs", "continuum"], [1, 2], [2.0, 4.0], repeat=2)
    assert order[:6] == [
        (0, 1, 2.0, "fcfs"),
        (0, 1, 2.0, "continuum"),
        (0, 1, 4.0, "fcfs"),
        (0, 1, 4.0, "continuum"),
        (0, 2, 2.0, "fcfs"),
        (0, 2, 2.0, "continuum"),
    ]
    assert len(order) == 16 and order[8] == (1, 1, 2.0, "fcfs")  # the second repeat starts over
    assert run_order(["fcfs"], [0], [1.0], repeat=1) == [(0, 0, 1.0, "fcfs")]  # --seed alone


def run(policy, seed, jct, hit=0.5, wait=1.0, p99=2.0, repeat=0):
    summary = {
        "jct_mean_s": jct,
        "jct_p95_s": 2 * jct,
        "cache_hit_ratio": hit,
        "max_request_wait_s": wait,
        "max_program_wait_s": 3 * wait,
        "p99_request_latency_s": p99,
    }
    return {"policy": policy, "jps": 1.0, "seed": seed, "repeat": repeat, "summary": summary}


SEEDS = range(1, 6)


def fleet():
    """Five seeds; continuum collapses on seed 4 (cache hit 0.1, half its median is 0.425)."""
    runs = [run("fcfs", s, j) for s, j in zip(SEEDS, [10, 12, 8, 20, 11])]
    runs += [run("lpm", s, j, 0.6) for s, j in zip(SEEDS, [9, 11, 8, 18, 10])]
    runs += [run("tlru", s, j, 0.6) for s, j in zip(SEEDS, [12, 12, 9, 16, 11])]
    runs += [
        run("continuum", s, j, h, w, p)
        for s, j, h, w, p in zip(
            SEEDS, [5, 6, 4, 30, 5.5], [0.9, 0.8, 0.9, 0.1, 0.85], [1, 2, 1, 40, 2], [3, 3, 2, 45, 4]
        )
    ]
    return runs


def test_a_run_collapses_when_its_reuse_falls_below_half_its_policys_median():
    assert collapsed_flags(fleet())[15:] == [False, False, False, True, False]
    assert not any(collapsed_flags(fleet())[:15])
    # the median is per policy and load: 0.2 is not a collapse where every run reuses little
    assert collapsed_flags([run("fcfs", 1, 1, 0.2), run("fcfs", 2, 1, 0.3), run("lpm", 1, 1, 0.9)]) == [False] * 3


def test_across_seeds_median_iqr_worst_ratios_and_collapse():
    rows = {r["policy"]: r for r in aggregate(fleet())}
    assert list(rows) == ["fcfs", "lpm", "tlru", "continuum"]
    c = rows["continuum"]
    assert c["runs"] == 5 and c["jct_mean_median_s"] == 5.5 and c["jct_mean_worst_s"] == 30
    assert (c["jct_mean_p25_s"], c["jct_mean_p75_s"]) == (5, 6) and c["jct_p95_median_s"] == 11
    # fcfs / continuum per seed: 10/5, 12/6, 8/4, 20/30, 11/5.5
    assert c["ratio_vs_fcfs_per_run"] == [2.0, 2.0, 2.0, 20 / 30, 2.0] and c["ratio_vs_fcfs_median"] == 2.0
    # best stock: lpm (median 10) beats tlru (median 12); lpm / continuum per seed: 1.8, 11/6, 2, 0.6, 10/5.5
    assert c["best_stock"] == "lpm" and c["ratio_vs_best_stock_median"] == 10 / 5.5
    assert c["collapsed_runs"] == 1 and c["cache_hit_median"] == 0.85
    assert c["max_request_wait_worst_s"] == 40 and c["p99_request_latency_worst_s"] == 45
    assert c["max_program_wait_worst_s"] == 120
    assert rows["lpm"]["ratio_vs_fcfs_per_run"] == [10 / 9, 12 / 11, 1.0, 20 / 18, 1.1]
    assert rows["lpm"]["ratio_vs_fcfs_median"] == 1.1
    assert rows["lpm"]["best_stock"] is None and rows["lpm"]["ratio_vs_best_stock_median"] is None  # stock itself
    assert rows["fcfs"]["ratio_vs_fcfs_median"] == 1.0 and rows["fcfs"]["collapsed_runs"] == 0
    text = headline(list(rows.values()))
    assert "median 2.00x vs fcfs, 1.82x vs the best stock policy (lpm)" in text
    assert "worst run 30.00 s vs fcfs's median 11.00 s; collapsed runs: 1." in text
    table = seeds_table(list(rows.values()))
    assert (
        "| continuum | 1 | 5 | 5.50 | 5.00-6.00 | 30.00 | 11.00 | 2.00x | 1.82x (lpm) | 40.00 | 120.00 | 45.00 | 85.0% | 1 |"
        in table
    )
    assert "| lpm | 1 | 5 | 10.00 | 9.00-11.00 | 18.00 | 20.00 | 1.10x | - |" in table


def test_without_an_fcfs_run_the_ratio_to_it_reads_as_absent_not_nan():
    rows = aggregate([run("lpm", 1, 10), run("continuum", 1, 5)])
    text, table = headline(rows), seeds_table(rows)
    assert "nan" not in text + table
    assert "no fcfs run, 2.00x vs the best stock policy (lpm)" in text
    assert "| continuum | 1 | 1 | 5.00 | 5.00-5.00 | 5.00 | " in table and "| - | 2.00x (lpm) |" in table


def test_ratios_pair_runs_by_seed_and_repeat_and_hicache_by_tier():
    runs = [run("fcfs", 1, 10, repeat=0), run("fcfs", 1, 30, repeat=1)]
    runs += [run("continuum", 1, 5, repeat=0), run("continuum", 1, 10, repeat=1)]
    runs += [run("lpm+hicache", 1, 4), run("fcfs+hicache", 1, 8), run("continuum+hicache", 1, 2)]
    rows = {r["policy"]: r for r in aggregate(runs)}
    assert rows["continuum"]["ratio_vs_fcfs_per_run"] == [2.0, 3.0] and rows["continuum"]["ratio_vs_fcfs_median"] == 2.5
    assert rows["continuum"]["best_stock"] is None  # no stock policy but fcfs on its tier
    h = rows["continuum+hicache"]
    assert h["ratio_vs_fcfs_per_run"] == [4.0] and h["best_stock"] == "lpm+hicache"
    assert h["ratio_vs_best_stock_median"] == 2.0


def test_every_run_table_names_the_seed_and_marks_collapsed_runs():
    rows = [
        {"policy": "fcfs", "jps": 1.0, "seed": 3, "repeat": 0, "jct_mean_s": 10.0, "jct_p95_s": 20.0},
        {
            "policy": "continuum",
            "jps": 1.0,
            "seed": 3,
            "repeat": 0,
            "collapsed": True,
            "jct_mean_s": 20.0,
            "jct_p95_s": 40.0,
        },
        {"policy": "fcfs", "jps": 1.0, "seed": 3, "repeat": 1, "jct_mean_s": 4.0, "jct_p95_s": 8.0},
        {"policy": "continuum", "jps": 1.0, "seed": 3, "repeat": 1, "jct_mean_s": 2.0, "jct_p95_s": 4.0},
    ]
    lines = markdown_table(rows).splitlines()
    assert lines[0].startswith("| policy | jps | seed | mean JCT s |")
    assert lines[3].startswith("| continuum | 1 | 3 (collapsed) | 20.00 |") and lines[3].endswith("| 0.50x | 0.50x |")
    assert lines[5].startswith("| continuum | 1 | 3/r1 | 2.00 |") and lines[5].endswith("| 2.00x | 2.00x |")


def test_stock_policies_are_real_sglang_flags():
    args, env = parse_policy("tlru")
    assert args == ["--schedule-policy", "fcfs", "--radix-eviction-policy", "tlru"] and env == {}
    assert "--enable-session-radix-cache" in parse_policy("session")[0]
    assert parse_policy("priority-evict")[0][-1] == "priority"


def test_plots_pool_seeds_and_draw_the_load_curve_from_medians(tmp_path):
    def replayed(policy, seed, jps, jct):
        turns = [
            {"turn": i, "error": None, "send": i * jct / 2, "finish": (i + 1) * jct / 2, "queue_time_s": 0.1 * i}
            for i in range(2)
        ]
        r = run(policy, seed, jct)
        return {**r, "jps": jps, "replay": {"programs": [{"ok": True, "jct": jct, "turns": turns}]}}

    runs = [
        replayed(p, s, j, jct) for j in (1.0, 2.0) for s in (1, 2) for p, jct in (("fcfs", 4.0), ("continuum", 2.0))
    ]
    assert [p.name for p in plots(runs, tmp_path)] == [
        "jct_cdf.png",
        "turn_latency.png",
        "turn_queue.png",
        "jct_vs_jps.png",
    ]
    assert all(p.stat().st_size > 1000 for p in tmp_path.iterdir())
    assert [p.name for p in plots([r for r in runs if r["jps"] == 2.0], tmp_path / "one")] == [
        "jct_cdf.png",
        "turn_latency.png",
        "turn_queue.png",
    ]


def test_context_length_is_capped_at_the_model_limit(tmp_path):
    """A pool that holds every program is larger than the model's positions: SGLang refuses a
    --context-length beyond them, so the server of a no-pressure run never started."""
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    assert context_length(str(tmp_path), 152_100) == 32768
    assert context_length(str(tmp_path), 11_407) == 11_407
    assert context_length(None, 152_100) == 152_100  # --url: no server started, nothing to cap


def test_pins_and_hits_by_a_mark_count_from_the_start_of_the_run():
    from continuum_lab.bench.replay import ProgramRecord, ReplayResult, TurnRecord
    from continuum_lab.bench.report import summarize

    def scrape(created, hits):
        return (
            f'sglang:continuum_pins_created_total{{tp_rank="0"}} {created}\n'
            f'sglang:continuum_pin_hits_total{{tp_rank="0"}} {hits}\n'
        )

    turn = TurnRecord("p", 0, send=0.0, first_token=0.1, finish=0.2, prompt_tokens=10)
    result = ReplayResult(
        [ProgramRecord("p", 0.0, start=0.0, end=0.2, turns=[turn])],
        100.0,
        metrics_before=scrape(5, 2),  # a server that served before this run
        metrics_after=scrape(40, 30),
        metrics_at={"60": scrape(12, 4)},
    )
    s = summarize(result)
    assert (s["pins_created_60s"], s["pin_hits_60s"], s["pins_created"], s["pin_hits"]) == (7, 2, 35, 28)
    assert ReplayResult.from_dict(result.to_dict()).metrics_at == {"60": scrape(12, 4)}


STAGES = 'sglang:scheduler_stage_seconds_total{{category="{}",forward_overlap="none",tp_rank="0"}} {}'


def stage_text(**seconds):
    return "\n".join(STAGES.format(k, v) for k, v in seconds.items())


def test_server_time_splits_the_schedulers_wall_into_forwards_loop_and_idle():
    from continuum_lab.bench.report import server_time

    before = stage_text(run_batch=1.0, idle=5.0, process_batch_result=0.1, recv_requests=0.0)
    after = stage_text(run_batch=16.0, idle=14.0, process_batch_result=0.9, recv_requests=0.2)
    t = server_time(before, after)
    assert t["server_forward_s"] == 15.0 and t["server_idle_s"] == 9.0
    assert abs(t["server_loop_s"] - 1.0) < 1e-9  # 0.8 processing results + 0.2 receiving
    assert server_time("", "sglang:num_requests_total 3") == {}  # a server without --enable-metrics


def test_validation_flags_each_policy_outside_fifteen_percent():
    from continuum_lab.emulator.validate import compare, markdown

    def report(jcts, forward):
        runs = []
        for policy, jct in jcts.items():
            r = run(policy, 1, jct)
            r["summary"]["server_forward_s"] = forward
            turn = {"ttft": 0.1, "queue_time_s": 0.05, "send": 0.0, "finish": 0.3}
            r["replay"] = {"programs": [{"turns": [turn]}]}
            runs.append(r)
        return {"runs": runs}

    result = compare(report({"fcfs": 10.0, "continuum": 8.0}, 15.0), report({"fcfs": 11.4, "continuum": 9.5}, 16.0))
    by = {r["policy"]: r for r in result["rows"]}
    assert by["fcfs"]["within_tolerance"] and not by["continuum"]["within_tolerance"]  # 1.14x vs 1.19x
    assert not result["all_within_tolerance"] and by["fcfs"]["emulated"]["median_forward_s"] == 16.0
    assert result["ranking_real"] == result["ranking_emulated"] == ["continuum", "fcfs"]
    assert "outside: continuum" in markdown(result, "real.json", "emu.json")


def test_a_programs_wait_is_the_sum_of_its_turns_waits_and_the_longest_is_reported():
    # the door's single long wait against a stock policy's many short ones: what a program feels
    # is the sum, so the report gives both the longest request wait and the longest program wait
    from continuum_lab.bench.replay import ProgramRecord, ReplayResult, TurnRecord
    from continuum_lab.bench.report import summarize

    def turn(pid, i, send, queue, ttft=None):
        first = send + (ttft if ttft is not None else queue + 0.1)
        return TurnRecord(pid, i, send=send, first_token=first, finish=first + 0.1, prompt_tokens=10,
                          queue_time_s=None if ttft is not None else queue)  # fmt: skip

    held = ProgramRecord("held", 0.0, start=0.0, end=9.0, turns=[turn("held", 0, 0.0, 5.0), turn("held", 1, 6.0, 0.5)])
    spread = ProgramRecord(
        "spread", 0.0, start=0.0, end=20.0, turns=[turn("spread", i, 4.0 * i, 2.0) for i in range(4)]
    )
    no_queue_time = ProgramRecord("ttft", 0.0, start=0.0, end=2.0, turns=[turn("ttft", 0, 0.0, 0, ttft=1.5)])
    s = summarize(ReplayResult([held, spread, no_queue_time], 30.0))
    assert s["max_request_wait_s"] == 5.0
    assert s["max_program_wait_s"] == 8.0  # 4 turns x 2 s, longer than the held program's 5.5 s


def test_an_emulated_report_names_the_scheduler_loop_its_runs_stepped():
    from continuum_lab.bench.report import emulated_loops

    overlap, serial, older = {"emulator": {"overlap": True}}, {"emulator": {"overlap": False}}, {"emulator": {}}
    assert emulated_loops([overlap, overlap]) == "its overlap loop, as a server runs it"
    assert emulated_loops([older]) == emulated_loops([serial]) == "its serial loop (`--disable-overlap-schedule`)"
    assert emulated_loops([serial, overlap]).startswith("its overlap loop, as a server runs it and its serial loop")
