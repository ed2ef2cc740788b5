"""An RL rollout step's figures and report (``continuum-bench --rollout``).

A step releases all its programs at once (t = 0) and ends when the last one does. Per run
(``step_figures``): the **makespan** (step start to the last program's end), each program's
completion time (JCT: step start to its last response; every program starts at 0) as mean, p50
and p90, output tokens per second of makespan and the cached share of prompt tokens. A program
the time limit cut off counts with the time it had run (a lower bound), and the makespan is then
the limit, flagged. A failed program (a turn the server refused, or one that timed out on every
try: ``failed_programs``) counts until it failed. ``timeouts`` and ``retries``: the tries whose
client gave up on them and the resends; a timed-out try's tokens do not count.

``aggregate`` gives per policy the median over seeds (worst seed for the makespan) and the
makespan against the best stock policy on the same seed: the stock policy with the lowest median
makespan on the same cache tiers, ratio = its makespan / the policy's (>1: the step ends sooner).

Pure functions over run records ``{"policy", "seed", "figures": {...}}``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from continuum_lab.bench.replay import ReplayResult
from continuum_lab.bench.seeds import is_stock

# (figure, column title, format): the table's columns, medians over seeds
COLUMNS = (
    ("makespan_s", "makespan s", "{:.1f}"),
    ("jct_mean_s", "mean JCT s", "{:.1f}"),
    ("jct_p50_s", "p50 JCT s", "{:.1f}"),
    ("jct_p90_s", "p90 JCT s", "{:.1f}"),
    ("output_tokens_per_s", "output tok/s", "{:.0f}"),
    ("cache_hit", "cached", "{:.1%}"),
)


def step_figures(result: ReplayResult) -> dict:
    """One step's figures from its records (all programs released at 0, ``wall_s``: when the run
    stopped: the last program's end, or the time limit)."""
    completions, finished, failed, unfinished = [], 0, 0, 0
    prompt = cached = output = 0
    for p in result.programs:
        done = [t for t in p.turns if t.finish is not None and t.error is None]
        prompt += sum(t.prompt_tokens for t in done)
        cached += sum(t.cached_tokens for t in done)
        output += sum(t.output_tokens for t in done)
        if p.ok:
            finished += 1
            completions.append(p.end - p.planned_arrival)
        elif any(t.error is not None for t in p.turns):
            failed += 1
            completions.append(max(t.finish or 0.0 for t in p.turns) - p.planned_arrival)
        else:  # cut off by the time limit: it ran until then at least
            unfinished += 1
            completions.append(result.wall_s - p.planned_arrival)
    makespan = max(completions, default=0.0)
    return {
        "programs": len(result.programs),
        "finished": finished,
        "failed": failed,
        "failed_programs": sum(p.timed_out for p in result.programs),
        "timeouts": sum(t.timeouts for p in result.programs for t in p.turns),
        "retries": sum(t.retries for p in result.programs for t in p.turns),
        "unfinished": unfinished,
        "time_limit_hit": unfinished > 0,
        "makespan_s": makespan,
        "jct_mean_s": float(np.mean(completions)) if completions else None,
        "jct_p50_s": float(np.percentile(completions, 50)) if completions else None,
        "jct_p90_s": float(np.percentile(completions, 90)) if completions else None,
        "turns": sum(len(p.turns) for p in result.programs),
        "output_tokens": output,
        "output_tokens_per_s": output / makespan if makespan > 0 else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit": cached / prompt if prompt else None,
    }


def _tier(policy: str) -> str:
    return policy.partition("+")[2]


def _median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def best_stock(runs: list[dict], policy: str) -> Optional[str]:
    """The stock policy with the lowest median makespan, on ``policy``'s cache tiers (with or
    without a host tier)."""
    spans: dict[str, list[float]] = {}
    for r in runs:
        if is_stock(r["policy"]) and bool(_tier(r["policy"])) == bool(_tier(policy)):
            spans.setdefault(r["policy"], []).append(r["figures"]["makespan_s"])
    return min(spans, key=lambda p: float(np.median(spans[p]))) if spans else None


def makespan_ratios(runs: list[dict], policy: str, other: str) -> list[float]:
    """``other``'s makespan / ``policy``'s on the same seed and repeat (>1: ``policy``'s step ends
    sooner)."""
    span = {(r["policy"], r["seed"], r.get("repeat", 0)): r["figures"]["makespan_s"] for r in runs}
    return [
        span[(other, seed, rep)] / value
        for (p, seed, rep), value in span.items()
        if p == policy and (other, seed, rep) in span and value > 0
    ]


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per policy, in run order."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(r["policy"], []).append(r)
    rows = []
    for policy, group in groups.items():
        row: dict = {"policy": policy, "seeds": [r["seed"] for r in group]}
        for key, _, _ in COLUMNS:
            row[key] = _median([r["figures"][key] for r in group])
        row["makespan_worst_s"] = max(r["figures"]["makespan_s"] for r in group)
        row["time_limit_hit"] = sum(r["figures"]["time_limit_hit"] for r in group)
        row["failed"] = sum(r["figures"]["failed"] for r in group)
        for key in ("failed_programs", "timeouts", "retries"):  # absent from runs before clients gave up
            row[key] = sum(r["figures"].get(key, 0) for r in group)
        row["finished"] = sum(r["figures"]["finished"] for r in group)
        row["programs"] = sum(r["figures"]["programs"] for r in group)
        best = None if is_stock(policy) else best_stock(runs, policy)
        ratios = makespan_ratios(runs, policy, best) if best else []
        row["best_stock"] = best
        row["vs_best_stock_median"] = _median(ratios)
        row["vs_best_stock_worst"] = min(ratios) if ratios else None
        rows.append(row)
    return rows


def _cell(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def markdown(rows: list[dict]) -> str:
    head = ["policy", "makespan s (worst seed)", *(c[1] for c in COLUMNS[1:]), "finished", "timeouts / retries",
            "vs best stock"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        vs = "-"
        if row["vs_best_stock_median"] is not None:
            vs = f"{row['vs_best_stock_median']:.2f}x ({row['vs_best_stock_worst']:.2f}x) vs {row['best_stock']}"
        limit = f", limit hit in {row['time_limit_hit']} run(s)" if row["time_limit_hit"] else ""
        timed_out = f" ({row['failed_programs']} timed out)" if row["failed_programs"] else ""
        failed = f", {row['failed']} failed{timed_out}" if row["failed"] else ""
        cells = [
            row["policy"],
            f"{row['makespan_s']:.1f} ({row['makespan_worst_s']:.1f})",
            *(_cell(row[k], f) for k, _, f in COLUMNS[1:]),
            f"{row['finished']}/{row['programs']}{failed}{limit}",
            f"{row['timeouts']} / {row['retries']}",
            vs,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_markdown(runs: list[dict]) -> str:
    """Every run's figures."""
    head = ["policy", "seed", *(c[1] for c in COLUMNS), "finished", "failed", "of them timed out", "timeouts",
            "retries", "time limit hit"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        f = r["figures"]
        cells = [r["policy"], str(r["seed"]), *(_cell(f[k], fmt) for k, _, fmt in COLUMNS)]
        cells += [f"{f['finished']}/{f['programs']}", str(f["failed"])]
        cells += [str(f.get(key, "-")) for key in ("failed_programs", "timeouts", "retries")]
        cells.append("yes" if f["time_limit_hit"] else "no")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
