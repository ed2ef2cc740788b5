"""continuum-bench's policy flags and report table (pure)."""

from sglang_continuum.bench.cli import HICACHE_CPU_FLAGS, parse_policy
from sglang_continuum.bench.report import baseline_of, markdown_table


def test_hicache_policies_get_the_host_tier_flags_and_cpu_io_backend():
    args, env = parse_policy("continuum+hicache")
    assert args[:2] == ["--schedule-policy", "continuum"] and "--enable-hierarchical-cache" in args
    assert args[-len(HICACHE_CPU_FLAGS):] == HICACHE_CPU_FLAGS and env["SGLANG_CONTINUUM_TTL_MODEL"] == "cost"
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
