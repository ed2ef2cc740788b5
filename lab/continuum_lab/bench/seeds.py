"""Comparing policies through the noise: every policy on every seed, interleaved, then per
policy the median, interquartile range and worst seed, ratios against fcfs on the same seed and
against the best stock policy, the worst request wait and latency, and the runs that collapsed
(their prefix reuse fell below half the policy's median).

Pure functions over run records ``{"policy", "jps", "seed", "repeat", "summary": {...}}``.
"""

from __future__ import annotations

from itertools import product
from typing import Optional

import numpy as np

from continuum_lab.bench.report import baseline_of

STOCK = ("fcfs", "lpm", "tlru", "priority-evict", "session")  # what an SGLang user has today


def run_order(
    policies: list[str], seeds: list[int], jps: list[float], repeat: int
) -> list[tuple[int, int, float, str]]:
    """(repeat, seed, jps, policy) in the order runs happen: policies innermost, so slow drift of
    the machine hits every policy alike."""
    return [(r, s, j, p) for r, s, j, p in product(range(repeat), seeds, jps, policies)]


def is_stock(policy: str) -> bool:
    return policy.partition("+")[0] in STOCK


def collapsed_flags(runs: list[dict]) -> list[bool]:
    """Per run: its cache-hit ratio fell below half the median of the same policy's runs at the
    same load -- the re-prefill spiral one unlucky seed can fall into, which a mean hides."""
    hits: dict[tuple[str, float], list[float]] = {}
    for r in runs:
        hits.setdefault((r["policy"], r["jps"]), []).append(r["summary"]["cache_hit_ratio"])
    return [r["summary"]["cache_hit_ratio"] < 0.5 * float(np.median(hits[(r["policy"], r["jps"])])) for r in runs]


def ratios_vs(runs: list[dict], policy: str, other: str, jps: float) -> list[float]:
    """``other``'s mean JCT / ``policy``'s on the same seed and repeat (>1: ``policy`` is faster),
    for every run of ``policy`` at ``jps`` that ``other`` has a partner for."""
    mean = {(r["policy"], r["seed"], r.get("repeat", 0)): r["summary"]["jct_mean_s"] for r in runs if r["jps"] == jps}
    return [
        mean[(other, seed, rep)] / jct
        for (p, seed, rep), jct in mean.items()
        if p == policy and (other, seed, rep) in mean and jct > 0
    ]


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def _times(ratio: float) -> str:
    """A ratio as ``1.23x``; ``-`` where there was nothing to compare with (NaN: no partner run)."""
    return "-" if np.isnan(ratio) else f"{ratio:.2f}x"


def aggregate(runs: list[dict], baseline: str = "fcfs") -> list[dict]:
    """One row per (policy, jps) over its runs, in the order policies first ran; see the module
    docstring. Worst values are NaN when a run has none (it failed)."""
    groups: dict[tuple[str, float], list[tuple[dict, bool]]] = {}
    for run, collapsed in zip(runs, collapsed_flags(runs)):
        groups.setdefault((run["policy"], run["jps"]), []).append((run, collapsed))
    rows = []
    for (policy, jps), group in groups.items():
        summaries = [r["summary"] for r, _ in group]
        jct = np.array([s["jct_mean_s"] for s in summaries], dtype=float)
        q25, q50, q75 = (float(x) for x in np.percentile(jct, [25, 50, 75]))
        ratios = ratios_vs(runs, policy, baseline_of(policy, baseline), jps)
        rows.append(
            {
                "policy": policy,
                "jps": jps,
                "runs": len(group),
                "jct_mean_median_s": q50,
                "jct_mean_p25_s": q25,
                "jct_mean_p75_s": q75,
                "jct_mean_worst_s": float(jct.max()),
                "jct_p95_median_s": _median([s["jct_p95_s"] for s in summaries]),
                "cache_hit_median": _median([s["cache_hit_ratio"] for s in summaries]),
                "max_request_wait_worst_s": float(np.max([s["max_request_wait_s"] for s in summaries])),
                # absent from runs summarized before it was recorded (--reuse-runs)
                "max_program_wait_worst_s": float(np.max([s.get("max_program_wait_s", np.nan) for s in summaries])),
                "p99_request_latency_worst_s": float(np.max([s["p99_request_latency_s"] for s in summaries])),
                "ratio_vs_fcfs_per_run": ratios,
                "ratio_vs_fcfs_median": _median(ratios),
                "collapsed_runs": sum(c for _, c in group),
                # what the clients gave up on, over every run (absent from runs before they did)
                "timeouts": sum(s.get("timeouts", 0) for s in summaries),
                "failed_programs": sum(s.get("failed_programs", 0) for s in summaries),
            }
        )
    for row in rows:
        best = None if is_stock(row["policy"]) else best_stock(rows, row["policy"], row["jps"], baseline)
        row["best_stock"] = best
        row["ratio_vs_best_stock_median"] = _median(ratios_vs(runs, row["policy"], best, row["jps"])) if best else None
    return rows


def best_stock(rows: list[dict], policy: str, jps: float, baseline: str = "fcfs") -> Optional[str]:
    """The stock policy other than the baseline, on ``policy``'s cache tiers (``+hicache`` with
    ``+hicache``), with the lowest median mean JCT at ``jps``: what an SGLang user would pick."""
    tier = policy.partition("+")[1:]
    stock = [
        r
        for r in rows
        if r["jps"] == jps
        and is_stock(r["policy"])
        and r["policy"].partition("+")[1:] == tier
        and r["policy"] != baseline_of(policy, baseline)
    ]
    return min(stock, key=lambda r: r["jct_mean_median_s"])["policy"] if stock else None


def seeds_table(rows: list[dict]) -> str:
    head = [
        "policy",
        "jps",
        "runs",
        "median mean JCT s",
        "IQR s",
        "worst s",
        "median P95 s",
        "median vs fcfs",
        "median vs best stock",
        "worst max wait s",
        "worst program wait s",
        "worst P99 request s",
        "median cache hit",
        "collapsed",
        "timeouts / failed programs",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vs_best = f"{r['ratio_vs_best_stock_median']:.2f}x ({r['best_stock']})" if r["best_stock"] else "-"
        cells = [
            r["policy"],
            f"{r['jps']:g}",
            str(r["runs"]),
            f"{r['jct_mean_median_s']:.2f}",
            f"{r['jct_mean_p25_s']:.2f}-{r['jct_mean_p75_s']:.2f}",
            f"{r['jct_mean_worst_s']:.2f}",
            f"{r['jct_p95_median_s']:.2f}",
            _times(r["ratio_vs_fcfs_median"]),
            vs_best,
            f"{r['max_request_wait_worst_s']:.2f}",
            f"{r['max_program_wait_worst_s']:.2f}",
            f"{r['p99_request_latency_worst_s']:.2f}",
            f"{r['cache_hit_median']:.1%}",
            str(r["collapsed_runs"]),
            f"{r['timeouts']} / {r['failed_programs']}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def headline(rows: list[dict], policy: str = "continuum") -> str:
    """One line per load: the policy's median ratio vs fcfs and vs the best stock policy, its worst
    run against fcfs's median, and collapsed runs."""
    lines = []
    for r in (r for r in rows if r["policy"] == policy):
        base = next((x for x in rows if x["policy"] == baseline_of(policy) and x["jps"] == r["jps"]), None)
        worst_vs = (
            f"; worst run {r['jct_mean_worst_s']:.2f} s vs fcfs's median {base['jct_mean_median_s']:.2f} s"
            if base
            else ""
        )
        best = (
            f", {r['ratio_vs_best_stock_median']:.2f}x vs the best stock policy ({r['best_stock']})"
            if r["best_stock"]
            else ""
        )
        vs_fcfs = r["ratio_vs_fcfs_median"]
        ratios = f"median {vs_fcfs:.2f}x vs fcfs{best}" if not np.isnan(vs_fcfs) else f"no fcfs run{best}"
        lines.append(
            f"{policy} at {r['jps']:g} programs/s over {r['runs']} runs: median mean JCT {r['jct_mean_median_s']:.2f} s, "
            f"{ratios}{worst_vs}; collapsed runs: {r['collapsed_runs']}."
        )
    return "\n".join(lines)
