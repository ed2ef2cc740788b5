"""Comparing policies through the noise: every policy on every seed, interleaved, then per
policy the median, interquartile range and worst seed, ratios against fcfs on the same seed, and
the runs that collapsed (their prefix reuse fell below half the policy's median).

Pure functions over run records ``{"policy", "jps", "seed", "repeat", "summary": {...}}``.
"""

from __future__ import annotations

from itertools import product
from typing import Iterable, Optional

import numpy as np

from sglang_continuum.bench.report import baseline_of

STOCK = ("fcfs", "lpm", "tlru", "priority-evict", "session")  # what an SGLang user has today


def run_order(
    policies: list[str], seeds: list[int], jps: list[float], repeat: int
) -> list[tuple[int, int, float, str]]:
    """(repeat, seed, jps, policy) in the order runs happen: policies innermost, so slow drift of
    the machine hits every policy alike."""
    return [(r, s, j, p) for r, s, j, p in product(range(repeat), seeds, jps, policies)]


def is_stock(policy: str) -> bool:
    return policy.partition("+")[0] in STOCK


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    a = np.asarray(xs, dtype=float)
    return tuple(float(x) for x in np.percentile(a, [25, 50, 75]))


def aggregate(runs: Iterable[dict], baseline: str = "fcfs") -> list[dict]:
    """One row per (policy, jps) over its runs; see the module docstring."""
    runs = list(runs)
    by_key: dict[tuple[str, float], list[dict]] = {}
    for run in runs:
        by_key.setdefault((run["policy"], run["jps"]), []).append(run)
    index = {(r["policy"], r["jps"], r["seed"], r.get("repeat", 0)): r for r in runs}
    rows = []
    for (policy, jps), group in by_key.items():
        jct = [g["summary"]["jct_mean_s"] for g in group]
        p95 = [g["summary"]["jct_p95_s"] for g in group]
        hit = [g["summary"]["cache_hit_ratio"] for g in group]
        median_hit = float(np.median(hit))
        collapsed = [g["seed"] for g, h in zip(group, hit) if h < 0.5 * median_hit]
        ratios = []
        for g in group:
            base = index.get((baseline_of(policy, baseline), jps, g["seed"], g.get("repeat", 0)))
            if base is not None and g["summary"]["jct_mean_s"] > 0:
                ratios.append(base["summary"]["jct_mean_s"] / g["summary"]["jct_mean_s"])
        q25, q50, q75 = _quantiles(jct)
        rows.append(
            {
                "policy": policy,
                "jps": jps,
                "runs": len(group),
                "jct_mean_median_s": q50,
                "jct_mean_p25_s": q25,
                "jct_mean_p75_s": q75,
                "jct_mean_worst_s": max(jct),
                "jct_p95_median_s": float(np.median(p95)),
                "cache_hit_median": median_hit,
                "max_request_wait_worst_s": max(g["summary"].get("max_request_wait_s", float("nan")) for g in group),
                "ratio_vs_fcfs_per_run": ratios,
                "ratio_vs_fcfs_median": float(np.median(ratios)) if ratios else float("nan"),
                "collapsed_seeds": collapsed,
            }
        )
    for row in rows:
        best = best_stock(rows, row["jps"], exclude=row["policy"])
        row["best_stock"] = best["policy"] if best else None
        row["ratio_vs_best_stock"] = (
            best["jct_mean_median_s"] / row["jct_mean_median_s"]
            if best and row["jct_mean_median_s"] > 0
            else float("nan")
        )
    return rows


def best_stock(rows: list[dict], jps: float, exclude: Optional[str] = None) -> Optional[dict]:
    """The stock policy (other than the baseline) with the lowest median mean JCT at ``jps``."""
    stock = [
        r
        for r in rows
        if r["jps"] == jps
        and is_stock(r["policy"])
        and r["policy"].partition("+")[0] != "fcfs"
        and r["policy"] != exclude
    ]
    return min(stock, key=lambda r: r["jct_mean_median_s"]) if stock else None


def seeds_table(rows: list[dict]) -> str:
    head = [
        "policy",
        "jps",
        "runs",
        "median mean JCT s",
        "IQR s",
        "worst seed s",
        "median P95 s",
        "median cache hit",
        "worst max wait s",
        "median ratio vs fcfs",
        "vs best stock",
        "collapsed",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vs_best = f"{r['ratio_vs_best_stock']:.2f}x vs {r['best_stock']}" if r["best_stock"] else "-"
        out.append(
            "| "
            + " | ".join(
                [
                    r["policy"],
                    f"{r['jps']:g}",
                    str(r["runs"]),
                    f"{r['jct_mean_median_s']:.2f}",
                    f"{r['jct_mean_p25_s']:.2f}-{r['jct_mean_p75_s']:.2f}",
                    f"{r['jct_mean_worst_s']:.2f}",
                    f"{r['jct_p95_median_s']:.2f}",
                    f"{r['cache_hit_median']:.1%}",
                    f"{r['max_request_wait_worst_s']:.1f}",
                    f"{r['ratio_vs_fcfs_median']:.2f}x",
                    vs_best,
                    str(len(r["collapsed_seeds"])),
                ]
            )
            + " |"
        )
    return "\n".join(out)


def headline(rows: list[dict], policy: str = "continuum") -> str:
    """One paragraph: the product's median ratio vs fcfs and vs the best stock policy, its worst
    seed against fcfs's median seed, and collapsed runs."""
    lines = []
    for r in (r for r in rows if r["policy"] == policy):
        fcfs = next((x for x in rows if x["policy"] == baseline_of(policy) and x["jps"] == r["jps"]), None)
        worst_vs = (
            f"; worst seed {r['jct_mean_worst_s']:.2f} s vs fcfs's median {fcfs['jct_mean_median_s']:.2f} s"
            if fcfs
            else ""
        )
        best = (
            f", {r['ratio_vs_best_stock']:.2f}x vs the best stock policy ({r['best_stock']})" if r["best_stock"] else ""
        )
        lines.append(
            f"{policy} at {r['jps']:g} programs/s over {r['runs']} runs: median mean JCT {r['jct_mean_median_s']:.2f} s, "
            f"median ratio {r['ratio_vs_fcfs_median']:.2f}x vs fcfs{best}{worst_vs}; "
            f"collapsed runs: {len(r['collapsed_seeds'])}."
        )
    return "\n".join(lines)
