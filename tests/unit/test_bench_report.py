"""continuum-bench's policy flags and report table (pure)."""

from sglang_continuum.bench.cli import HICACHE_CPU_FLAGS, parse_policy
from sglang_continuum.bench.report import baseline_of, markdown_table


def test_hicache_policies_get_the_host_tier_flags_and_cpu_io_backend():
    args, env = parse_policy("continuum+hicache")
    assert args[:2] == ["--schedule-policy", "continuum"] and "--enable-hierarchical-cache" in args
    assert args[-len(HICACHE_CPU_FLAGS) :] == HICACHE_CPU_FLAGS and env["SGLANG_CONTINUUM_TTL_MODEL"] == "cost"
    gpu_args, _ = parse_policy("fcfs+hicache", cpu=False)
    assert "--enable-hierarchical-cache" in gpu_args and "direct" not in gpu_args


def test_each_policy_is_compared_with_fcfs_on_the_same_cache_tiers():
    assert baseline_of("continuum") == "fcfs" and baseline_of("continuum+hicache") == "fcfs+hicache"
    rows = [
        {"policy": p, "jps": 1.0, "jct_mean_s": m, "jct_p95_s": 2 * m}
        for p, m in [("fcfs", 10.0), ("continuum", 8.0), ("fcfs+hicache", 6.0), ("continuum+hicache", 4.0)]
    ]
    lines = markdown_table(rows).splitlines()[2:]
    assert [line.split("|")[-3].strip() for line in lines] == ["1.00x", "1.25x", "1.00x", "1.50x"]


def test_runs_interleave_policies_innermost():
    from sglang_continuum.bench.seeds import run_order

    order = run_order(["fcfs", "continuum"], [1, 2], [2.0], repeat=2)
    assert order[:4] == [(0, 1, 2.0, "fcfs"), (0, 1, 2.0, "continuum"), (0, 2, 2.0, "fcfs"), (0, 2, 2.0, "continuum")]
    assert len(order) == 8 and order[4][0] == 1


def run(policy, seed, jct, hit, p95=None, wait=1.0):
    return {
        "policy": policy,
        "jps": 1.0,
        "seed": seed,
        "repeat": 0,
        "summary": {"jct_mean_s": jct, "jct_p95_s": p95 or 2 * jct, "cache_hit_ratio": hit, "max_request_wait_s": wait},
    }


def test_across_seeds_median_iqr_worst_ratios_and_collapse():
    from sglang_continuum.bench.seeds import aggregate, headline, seeds_table

    runs = [run("fcfs", s, j, 0.5) for s, j in zip(range(1, 6), [10, 12, 8, 20, 11])]
    runs += [run("lpm", s, j, 0.6) for s, j in zip(range(1, 6), [9, 11, 8, 18, 10])]
    runs += [
        run("continuum", s, j, h, wait=w)
        for s, j, h, w in zip(range(1, 6), [5, 6, 4, 30, 5.5], [0.9, 0.8, 0.9, 0.1, 0.85], [1, 2, 1, 40, 2])
    ]
    rows = {r["policy"]: r for r in aggregate(runs)}
    c = rows["continuum"]
    assert (
        c["jct_mean_median_s"] == 5.5
        and c["jct_mean_worst_s"] == 30
        and (c["jct_mean_p25_s"], c["jct_mean_p75_s"]) == (5, 6)
    )
    assert c["ratio_vs_fcfs_per_run"] == [2.0, 2.0, 2.0, 20 / 30, 2.0] and c["ratio_vs_fcfs_median"] == 2.0
    assert c["collapsed_seeds"] == [4]  # hit 0.1 < half the median 0.85
    assert c["best_stock"] == "lpm" and c["ratio_vs_best_stock"] == 10 / 5.5
    assert c["max_request_wait_worst_s"] == 40
    assert rows["lpm"]["best_stock"] is None  # the only stock policy besides fcfs is itself
    assert rows["fcfs"]["ratio_vs_fcfs_median"] == 1.0 and rows["fcfs"]["collapsed_seeds"] == []
    text = headline(list(rows.values()))
    assert (
        "2.00x vs fcfs" in text
        and "collapsed runs: 1" in text
        and "worst seed 30.00 s vs fcfs's median 11.00 s" in text
    )
    assert "| continuum | 1 | 5 | 5.50 | 5.00-6.00 | 30.00 |" in seeds_table(list(rows.values()))


def test_stock_policies_are_real_sglang_flags():
    args, env = parse_policy("tlru")
    assert args == ["--schedule-policy", "fcfs", "--radix-eviction-policy", "tlru"] and env == {}
    assert "--enable-session-radix-cache" in parse_policy("session")[0]
    assert parse_policy("priority-evict")[0][-1] == "priority"
