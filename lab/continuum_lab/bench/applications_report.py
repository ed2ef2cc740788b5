"""The multi-agent grid's report (``continuum-bench --applications``): per load and policy, the
figures of ``bench/applications.py`` over seeds (median; for the mean application latency also
the spread, the interquartile range, and the worst seed), and the mean latency against fcfs on the
same cache tiers and seed.

Pure functions over run records ``{"policy", "aps", "seed", "repeat", "figures": {...}}``; ``plots``
draws the application-latency CDF and the KV pool's use over time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from continuum_lab.bench.report import baseline_of, save_figure

# (figure, column title, format): medians over seeds
COLUMNS = (
    ("app_latency_mean_s", "mean app latency s", "{:.1f}"),
    ("app_latency_p90_s", "P90 app latency s", "{:.1f}"),
    ("apps_per_s", "apps/s", "{:.3f}"),
    ("abnormal_agents", "abnormal agents", "{:.0f}"),
    ("abnormal_share", "abnormal share", "{:.1%}"),
    ("abnormal_critical", "abnormal on critical path", "{:.0f}"),
    ("kv_used_mean", "KV used mean", "{:.1%}"),
    ("kv_used_peak", "KV used peak", "{:.1%}"),
    ("output_tokens_per_s", "output tok/s", "{:.0f}"),
    ("tokens_per_s", "tokens/s", "{:.0f}"),
    ("mean_turn_wait_s", "turn queue s", "{:.3f}"),
    ("max_request_wait_s", "max wait s", "{:.2f}"),
    ("cache_hit_ratio", "cache hit", "{:.1%}"),
    ("uploads_used", "uploads used", "{:.0f}"),  # Continuum's series: 0 under a stock policy
)
COUNTS = (("failed_apps", "failed apps"), ("timeouts", "timeouts"))  # summed over seeds
KEY = "app_latency_mean_s"


def _median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _ratios(records: list[dict], policy: str, aps: float) -> list[float]:
    """The baseline's mean app latency / the policy's, seed by seed (>1: the policy is faster)."""
    by = {(r["policy"], r["seed"], r.get("repeat", 0)): r["figures"][KEY] for r in records if r["aps"] == aps}
    base = baseline_of(policy)
    return [
        by[(base, seed, rep)] / value
        for (p, seed, rep), value in by.items()
        if p == policy and value and by.get((base, seed, rep))
    ]


def aggregate(records: list[dict]) -> list[dict]:
    rows = []
    cells = dict.fromkeys((r["aps"], r["policy"]) for r in records)
    for aps, policy in cells:
        runs = [r for r in records if r["aps"] == aps and r["policy"] == policy]
        row = {"aps": aps, "policy": policy, "seeds": len(runs)}
        row |= {key: _median([r["figures"].get(key) for r in runs]) for key, _, _ in COLUMNS}
        row |= {key: sum(r["figures"].get(key) or 0 for r in runs) for key, _ in COUNTS}
        scored = [r for r in runs if r["figures"].get(KEY) is not None]
        if scored:
            values = [r["figures"][KEY] for r in scored]
            worst = max(scored, key=lambda r: r["figures"][KEY])
            row["app_latency_iqr_s"] = float(np.percentile(values, 75) - np.percentile(values, 25))
            row["app_latency_worst_s"] = worst["figures"][KEY]
            row["worst_seed"] = worst["seed"]
        ratios = _ratios(records, policy, aps)
        row["vs_fcfs"] = _median(ratios)
        row["vs_fcfs_worst"] = min(ratios) if ratios else None
        rows.append(row)
    return rows


def _cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def markdown(rows: list[dict]) -> str:
    head = ["aps", "policy", "seeds", COLUMNS[0][1], "spread (IQR) s", "worst seed s", *[c[1] for c in COLUMNS[1:]],
            *[c[1] for c in COUNTS], "vs fcfs (worst)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        worst = "-" if r.get("worst_seed") is None else f"{r['app_latency_worst_s']:.1f} (seed {r['worst_seed']})"
        ratio = "-" if r["vs_fcfs"] is None else f"{r['vs_fcfs']:.2f}x ({r['vs_fcfs_worst']:.2f}x)"
        cells = [f"{r['aps']:g}", r["policy"], str(r["seeds"]), _cell(r[KEY], COLUMNS[0][2]),
                 _cell(r.get("app_latency_iqr_s"), "{:.1f}"), worst,
                 *[_cell(r[k], fmt) for k, _, fmt in COLUMNS[1:]], *[str(r[k]) for k, _ in COUNTS], ratio]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_markdown(records: list[dict]) -> str:
    keys = ("app_latency_mean_s", "app_latency_p90_s", "abnormal_agents", "kv_used_mean", "tokens_per_s",
            "mean_turn_wait_s", "failed_apps")  # fmt: skip
    titles = {k: t for k, t, _ in COLUMNS} | dict(COUNTS)
    fmts = {k: f for k, _, f in COLUMNS} | {k: "{}" for k, _ in COUNTS}
    head = ["aps", "policy", "seed", *[titles[k] for k in keys], "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        f = r["figures"]
        cells = [f"{r['aps']:g}", r["policy"], str(r["seed"]), *[_cell(f.get(k), fmts[k]) for k in keys],
                 f"{f.get('wall_s', 0):.1f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plots(records: list[dict], out_dir: Path) -> list[Path]:
    """The application-latency CDF at the highest load (seeds pooled) and the KV pool's use over
    time on the first seed there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    focus = max(r["aps"] for r in records)
    first = min(r["seed"] for r in records)
    latencies: dict[str, list[float]] = {}
    for r in records:
        if r["aps"] == focus:
            latencies.setdefault(r["policy"], []).extend(r["figures"]["app_latencies_s"])
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, values in latencies.items():
        v = np.sort(values)
        ax.step(v, np.arange(1, len(v) + 1) / max(1, len(v)), where="post", label=policy)
    ax.set(xlabel="application latency (s)", ylabel="fraction of applications", title=f"At {focus:g} apps/s")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(save_figure(fig, out_dir / "app_latency_cdf.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in records:
        if r["aps"] == focus and r["seed"] == first and r.get("repeat", 0) == 0 and r["figures"]["kv_series"]:
            series = np.array([s[:2] for s in r["figures"]["kv_series"]])
            ax.plot(series[:, 0], series[:, 1], label=r["policy"])
    ax.set(xlabel="time (s)", ylabel="KV pool used", title=f"KV use, {focus:g} apps/s, seed {first}")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(save_figure(fig, out_dir / "kv_used.png"))
    return paths
