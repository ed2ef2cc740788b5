"""``continuum-aiperf``: the AIPerf command it builds, the figures it reads from AIPerf's exports and
the server's ``/metrics``, the per-policy report; and, where ``.venv-aiperf`` exists, one real run
end to end (a CPU server, AIPerf 0.13.0 against it, AIPerf's figures in the report)."""

import json
from pathlib import Path

import pytest

from continuum_lab.bench import aiperf_report
from continuum_lab.cli import aiperf_grid
from continuum_lab.harness.aiperf import AIPERF_VENV, ROUTING_KEY_ENV, AIPerfRun, MetricsWatch, profiling_span_s

ROOT = Path(__file__).resolve().parents[2]


def a_run(**kw) -> AIPerfRun:
    args = dict(binary=Path("aiperf"), url="http://127.0.0.1:1", model="m", tokenizer="tok", trace=Path("t.jsonl"),
                concurrency=16, duration_s=90, warmup_s=30, seed=2, artifact_dir=Path("art"), max_gap_s=10.0)  # fmt: skip
    return AIPerfRun(**(args | kw))


def test_the_command_is_sessions_at_fixed_concurrency_over_the_trace():
    cmd = a_run().command()
    pairs = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    assert cmd[1] == "profile"
    assert pairs["--custom-dataset-type"] == "mooncake_trace" and pairs["--input-file"] == "t.jsonl"
    assert pairs["--concurrency"] == "16" and pairs["--benchmark-duration"] == "90"
    assert pairs["--warmup-duration"] == "30" and pairs["--inter-turn-delay-cap-seconds"] == "10"
    assert pairs["--random-seed"] == "2" and pairs["--dataset-sampling-strategy"] == "shuffle"
    assert pairs["--extra-inputs"] == "ignore_eos:true" and "--use-server-token-count" in cmd
    assert "--streaming" in cmd and pairs["--tokenizer"] == "tok"
    no_warmup = a_run(warmup_s=0, max_gap_s=None).command()
    assert "--warmup-duration" not in no_warmup and "--inter-turn-delay-cap-seconds" not in no_warmup


def test_program_identity_is_aiperfs_routing_key_header_or_nothing(monkeypatch):
    monkeypatch.setenv(ROUTING_KEY_ENV, "true")  # an operator's own setting does not leak into "none"
    assert a_run().environment()[ROUTING_KEY_ENV] == "true"
    assert a_run().shell_command().startswith(f"{ROUTING_KEY_ENV}=true ")
    assert ROUTING_KEY_ENV not in a_run(identity="none").environment()


AGGREGATE = {
    "aiperf_version": "0.13.0",
    "time_to_first_token": {"unit": "ms", "avg": 500.0, "p50": 400.0, "p90": 1200.0, "p99": 1250.0},
    "request_latency": {"unit": "ms", "p90": 2200.0},
    "request_throughput": {"unit": "requests/sec", "avg": 0.97},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 35.7},
    "overall_usage_prompt_cache_read_pct": {"unit": "%", "avg": 75.2},
    "request_count": {"unit": "requests", "avg": 21.0},
    "total_usage_prompt_tokens": {"unit": "tokens", "avg": 36189.0},
    "benchmark_duration": {"unit": "sec", "avg": 21.7},
    "is_complete": True,
}


def test_aiperfs_figures_in_seconds():
    f = aiperf_report.aiperf_figures(AGGREGATE)
    assert (f["ttft_p50_s"], f["ttft_p90_s"], f["ttft_p99_s"]) == pytest.approx((0.4, 1.2, 1.25))
    assert f["output_tokens_per_s"] == 35.7 and f["requests_per_s"] == 0.97 and f["cache_read_pct"] == 75.2
    assert f["requests"] == 21 and f["failed_requests"] == 0.0 and f["complete"]


def test_the_servers_counters_over_aiperfs_measured_phase():
    snaps = [
        (10.0, {"sglang:prompt_tokens_total": 100.0, "sglang:cached_tokens_total": 0.0}),
        (12.0, {"sglang:prompt_tokens_total": 500.0, "sglang:cached_tokens_total": 100.0}),
        (20.0, {"sglang:prompt_tokens_total": 900.0, "sglang:cached_tokens_total": 300.0}),
        (22.0, {"sglang:prompt_tokens_total": 1300.0, "sglang:cached_tokens_total": 600.0,
                "sglang:generation_tokens_total": 50.0}),
    ]  # fmt: skip
    watch = MetricsWatch("http://127.0.0.1:1")
    watch.snapshots = snaps
    window = watch.window((12.5, 19.0))  # the snapshot before the phase's first request, the first after its end
    assert (window["from_s"], window["to_s"]) == (12.0, 20.0)
    figures = aiperf_report.server_figures(window)
    assert figures["prompt_tokens"] == 400 and figures["cache_hit"] == 0.5
    assert "pins_created" not in figures  # no plugin on this server
    assert watch.window(None)["delta"]["sglang:prompt_tokens_total"] == 1200


def test_the_plugins_prices_at_the_measured_phases_end_beside_its_counters():
    requests = 'sglang:continuum_requests_total{id_source="routing_key"}'
    growth, share, loss = (series for _, series, _, _ in aiperf_report.PRICE_COLUMNS)
    snaps = [
        (10.0, {"sglang:continuum_requests_total": 0.0, requests: 0.0, growth: 1.0, share: 0.9, loss: 1.0}),
        (20.0, {"sglang:continuum_requests_total": 8.0, requests: 8.0, growth: 0.0, share: 0.4, loss: 0.7}),
    ]
    watch = MetricsWatch("http://127.0.0.1:1")
    watch.snapshots = snaps
    figures = aiperf_report.server_figures(watch.window((10.0, 20.0)))
    assert figures["requests_routing_key"] == 8
    # a gauge is read as it stood at the end, not as a change over the phase
    assert (figures["growth_reserved_end"], figures["decode_share_end"], figures["release_loss_end"]) == (0.0, 0.4, 0.7)
    run = {"policy": "continuum", "seed": 1, "aiperf": {}, "server": figures, "exit": 0}
    assert "| 0 | 0.40 | 0.70 | 0 |" in aiperf_report.runs_table([run])


def test_the_measured_phases_span_from_aiperfs_records(tmp_path):
    rows = [
        {"metadata": {"benchmark_phase": "warmup", "request_start_ns": 1e9, "request_end_ns": 2e9}},
        {"metadata": {"benchmark_phase": "profiling", "request_start_ns": 5e9, "request_end_ns": 7e9}},
        {"metadata": {"benchmark_phase": "profiling", "request_start_ns": 6e9, "request_end_ns": 9e9}},
    ]
    (tmp_path / "profile_export.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert profiling_span_s(tmp_path) == (5.0, 9.0)
    assert profiling_span_s(tmp_path / "nothing") is None


def runs_of(table: dict) -> list[dict]:
    return [
        {"policy": p, "seed": s, "aiperf": {"output_tokens_per_s": tput, "ttft_p90_s": ttft}, "server": {}}
        for (p, s), (tput, ttft) in table.items()
    ]


def test_per_policy_median_spread_worst_seed_and_ratio_to_the_best_stock_policy():
    runs = runs_of({
        ("fcfs", 1): (40.0, 2.0), ("lpm", 1): (42.0, 2.5), ("continuum", 1): (50.4, 2.0),
        ("fcfs", 2): (38.0, 2.2), ("lpm", 2): (41.0, 2.4), ("continuum", 2): (41.0, 3.6),
        ("fcfs", 3): (44.0, 2.1), ("lpm", 3): (40.0, 2.6), ("continuum", 3): (48.0, 2.6),
    })  # fmt: skip
    rows = {r["policy"]: r for r in aiperf_report.aggregate(runs)}
    assert aiperf_report.best_stock(runs) == "lpm"  # median 41 against fcfs's 40
    tput = rows["continuum"]["aiperf"]["output_tokens_per_s"]
    assert (tput["median"], tput["min"], tput["max"], tput["worst_seed"]) == (48.0, 41.0, 50.4, 2)
    assert rows["continuum"]["aiperf"]["ttft_p90_s"]["worst_seed"] == 2  # the highest TTFT is the worst
    vs = rows["continuum"]["vs_best_stock_output"]
    assert vs["median"] == pytest.approx(1.2) and vs["worst"] == pytest.approx(1.0)
    assert rows["continuum"]["vs_best_stock_ttft_p90"]["worst"] == pytest.approx(1.5)
    assert "vs_best_stock_output" not in rows["fcfs"]
    table = aiperf_report.policy_table(aiperf_report.aggregate(runs))
    assert "| **continuum** | 1, 2, 3 | 48.0 (41.0-50.4) |" in table and "1.20x (1.00x) vs lpm" in table


def test_a_mooncake_trace_is_used_as_it_is_and_anything_else_converted(tmp_path):
    args = aiperf_grid.parse_args(["--model", "m", "--out", str(tmp_path)])
    assert args.trace == aiperf_grid.DEFAULT_TRACE and aiperf_grid.prepare_trace(args) == args.trace
    corpus = ROOT / "workloads" / "imported" / "claude-code-kvtester.jsonl"
    args = aiperf_grid.parse_args(["--model", "m", "--trace", str(corpus), "--token-scale", "0.05", "--programs", "3",
                                   "--out", str(tmp_path)])  # fmt: skip
    converted = aiperf_grid.prepare_trace(args)
    assert converted == tmp_path / "trace.mooncake.jsonl" and aiperf_grid.is_mooncake(converted)
    assert len({json.loads(line)["session_id"] for line in converted.read_text().splitlines()}) == 3


def test_the_servers_get_continuum_benchs_pool_and_profile(tmp_path):
    args = aiperf_grid.parse_args(["--model", str(ROOT / ".models" / "tiny-llama"), "--out", str(tmp_path)])
    from continuum_lab.bench.policies import pressure_pool_tokens
    from continuum_lab.workloads.mooncake_trace import read_trace

    programs = read_trace(args.trace)
    common, env, pool = aiperf_grid.server_setup(args, programs)
    assert pool == pressure_pool_tokens(programs, 3.0)
    assert common[:4] == ["--max-total-tokens", str(pool), "--context-length", str(pool)]
    assert {"--enable-metrics", "--enable-cache-report"} <= set(common)
    no_pool = aiperf_grid.parse_args(["--model", "m", "--pool-programs", "0", "--gpu"])
    common, env, pool = aiperf_grid.server_setup(no_pool, programs)
    assert pool is None and "--max-total-tokens" not in common and "SGLANG_CONTINUUM_PREFILL_PROFILE" not in env


@pytest.mark.e2e
@pytest.mark.skipif(
    not (ROOT / AIPERF_VENV / "bin" / "aiperf").exists(), reason="no .venv-aiperf (bash scripts/setup-aiperf.sh)"
)
def test_one_policy_one_seed_end_to_end(tiny_model, tmp_path, monkeypatch):
    """~60 s: a CPU continuum server, AIPerf with 3 sessions of 8 for 10 s, AIPerf's figures and the
    server's (every request carried AIPerf's per-session routing key) in the report."""
    monkeypatch.chdir(ROOT)  # the default trace and the CPU prefill profile are repository paths
    out = tmp_path / "out"
    code = aiperf_grid.main(["--model", tiny_model, "--policies", "continuum", "--seeds", "1", "--sessions", "3",
                             "--window-s", "10", "--warmup-s", "0", "--programs", "8", "--out", str(out)])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    assert code == 0 and run["exit"] == 0, run.get("problem")
    a = run["aiperf"]
    assert a["aiperf_version"] == "0.13.0" and a["requests"] > 0 and a["output_tokens_per_s"] > 0
    assert a["ttft_p50_s"] > 0 and a["ttft_p90_s"] >= a["ttft_p50_s"] and a["cache_read_pct"] is not None
    s = run["server"]
    # every request AIPerf measured reached the plugin with its session's key: none had to be inferred
    assert s["requests_routing_key"] >= a["requests"] and s["requests_inferred"] == s["requests_first_turn"] == 0
    assert report["rows"][0]["aiperf"]["output_tokens_per_s"]["median"] == a["output_tokens_per_s"]
    assert "MEASURED** by AIPerf 0.13.0" in (out / "report.md").read_text()
