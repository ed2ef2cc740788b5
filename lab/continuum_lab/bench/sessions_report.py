"""The fixed-concurrency grid's report: per session count N, every policy's window figures over
seeds (median, and the worst seed where it matters), its throughput against the best stock policy
on the same seed, and HiCache's own gain over fcfs apart from the plugin's. Beside the throughput,
what the clients gave up on, summed over seeds (``COUNTS``): tries timed out, resends, programs
failed by a turn that timed out on every try.

Pure functions over run records ``{"policy", "sessions", "seed", "figures": {...}}``; ``plots``
draws throughput and TTFT p90 against N.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from continuum_lab.bench.seeds import is_stock
from continuum_lab.bench.sessions import NO_RECORD
from sglang_continuum.core.programs import PIN_EXPIRED, PIN_FLUSHED, PIN_KEPT, PIN_NONE, PIN_REFUSED, PIN_RELEASED

HICACHE = "+hicache"

# (figure, column title, format): the table's columns, medians over seeds
COLUMNS = (
    ("output_tokens_per_s", "output tok/s", "{:.0f}"),
    ("turns_per_session_hour", "turns/session-h", "{:.1f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p90_s", "TTFT p90 s", "{:.2f}"),
    ("ttft_max_s", "TTFT max s", "{:.1f}"),
    ("in_server_mean_s", "in server s/turn", "{:.2f}"),
    ("cache_hit", "cached", "{:.1%}"),
    ("host_hit", "of it host", "{:.1%}"),
    ("reprefilled_tokens", "re-prefilled Mtok", "{:.1f}"),
    ("host_loaded_tokens_in_window", "host loads Mtok", "{:.1f}"),
    ("longest_wait_s", "longest wait s", "{:.1f}"),
    ("longest_program_wait_s", "longest program wait s", "{:.1f}"),
    # the door's holds (continuum): a first turn parked, a return paused at its turn boundary
    ("longest_park_s", "longest park s", "{:.1f}"),
    ("longest_pause_s", "longest pause s", "{:.1f}"),
    ("turns_paused", "turns paused", "{:.0f}"),
    ("first_turns_waiting_at_end", "first turns waiting at end", "{:.0f}"),
    # time averages over the window: where the throughput goes
    ("sessions_admitted_mean", "sessions admitted", "{:.1f}"),
    ("turns_running_mean", "turns running", "{:.1f}"),
    ("running_turn_prompt_tokens", "their prompts ktok", "{:.0f}"),
    ("returning_turns_waiting_mean", "returns waiting", "{:.1f}"),
    ("admitted_context_tokens_mean", "their contexts ktok", "{:.0f}"),
    ("admitted_context_tokens_peak", "at the peak ktok", "{:.0f}"),
)
# (figure, column title): what the clients gave up on (``sessions.window_figures``), summed over seeds
COUNTS = (
    ("timeouts", "timeouts"),
    ("retries", "retries"),
    ("failed_programs", "failed programs"),
)
# figures reported in millions or thousands of tokens
UNITS = {
    "reprefilled_tokens": 1e6,
    "host_loaded_tokens_in_window": 1e6,
    "running_turn_prompt_tokens": 1e3,
    "admitted_context_tokens_mean": 1e3,
    "admitted_context_tokens_peak": 1e3,
}


def _tier(policy: str) -> str:
    return policy.partition("+")[2]


def _figure(run: dict, key: str) -> Optional[float]:
    value = run["figures"].get(key)
    if value is None:
        return None
    return value / UNITS.get(key, 1.0)


def _median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _sum(values: list) -> Optional[float]:
    """None where no run counted it (runs from before clients gave up)."""
    values = [v for v in values if v is not None]
    return float(sum(values)) if values else None


def best_stock(runs: list[dict], policy: str, n: int) -> Optional[str]:
    """The stock policy an operator would pick against ``policy`` at N: the highest median
    throughput among stock policies with a host tier when ``policy`` has one (either write
    policy), else among those without."""
    hicache = bool(_tier(policy))
    medians: dict[str, list[float]] = {}
    for r in runs:
        if r["sessions"] == n and is_stock(r["policy"]) and bool(_tier(r["policy"])) == hicache:
            medians.setdefault(r["policy"], []).append(r["figures"]["output_tokens_per_s"])
    return max(medians, key=lambda p: float(np.median(medians[p]))) if medians else None


def throughput_ratios(runs: list[dict], policy: str, other: str, n: int) -> list[float]:
    """``policy``'s output throughput / ``other``'s on the same seed (>1: ``policy`` serves more)."""
    tps = {(r["policy"], r["seed"]): r["figures"]["output_tokens_per_s"] for r in runs if r["sessions"] == n}
    return [
        tps[(policy, seed)] / tps[(other, seed)]
        for (p, seed) in tps
        if p == policy and (other, seed) in tps and tps[(other, seed)] > 0
    ]


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per (N, policy), in run order."""
    rows: dict[tuple[int, str], dict] = {}
    for r in runs:
        rows.setdefault((r["sessions"], r["policy"]), {"sessions": r["sessions"], "policy": r["policy"], "runs": []})
        rows[(r["sessions"], r["policy"])]["runs"].append(r)
    out = []
    for (n, policy), row in rows.items():
        group = row.pop("runs")
        row["seeds"] = [r["seed"] for r in group]
        for key, _, _ in COLUMNS:
            row[key] = _median([_figure(r, key) for r in group])
        for key, _ in COUNTS:
            row[key] = _sum([_figure(r, key) for r in group])
        row["ttft_p90_worst_s"] = max((_figure(r, "ttft_p90_s") or 0.0) for r in group)
        row["longest_wait_worst_s"] = max((_figure(r, "longest_wait_s") or 0.0) for r in group)
        row["longest_program_wait_worst_s"] = max((_figure(r, "longest_program_wait_s") or 0.0) for r in group)
        best = None if is_stock(policy) else best_stock(runs, policy, n)
        ratios = throughput_ratios(runs, policy, best, n) if best else []
        row["best_stock"] = best
        row["vs_best_stock_median"] = _median(ratios)
        row["vs_best_stock_worst"] = min(ratios) if ratios else None
        if policy.startswith("fcfs+"):  # HiCache's own gain, apart from any plugin
            gain = throughput_ratios(runs, policy, "fcfs", n)
            row["vs_fcfs_no_host_median"] = _median(gain)
        out.append(row)
    return out


def _cell(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def markdown(rows: list[dict]) -> str:
    throughput, rest = COLUMNS[0], COLUMNS[1:]
    head = ["N", "policy", throughput[1], *(c[1] for c in COUNTS), *(c[1] for c in rest), "vs best stock (worst seed)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row.get("vs_best_stock_median") is not None:
            vs = f"{row['vs_best_stock_median']:.2f}x ({row['vs_best_stock_worst']:.2f}x) vs {row['best_stock']}"
        elif row.get("vs_fcfs_no_host_median") is not None:
            vs = f"host tier alone: {row['vs_fcfs_no_host_median']:.2f}x fcfs"
        else:
            vs = "-"
        cells = [
            str(row["sessions"]),
            row["policy"],
            _cell(row[throughput[0]], throughput[2]),
            *(_cell(row.get(k), "{:.0f}") for k, _ in COUNTS),
            *(_cell(row[k], f) for k, _, f in rest),
            vs,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# what became of a return's pin, in the table's order: these, then the sheds by reason, then the rest
PIN_ENDS_FIRST = (PIN_KEPT, PIN_NONE, PIN_REFUSED, PIN_EXPIRED)
PIN_ENDS_LAST = (PIN_RELEASED, PIN_FLUSHED, NO_RECORD)


def pin_end_markdown(runs: list[dict]) -> str:
    """Where each plugin run's re-prefill came from: per run, for each way its programs' pins
    ended, the returns that lost most of their context of all returns, and the Mtok re-prefilled
    (the window's; "" where no run has the plugin's records)."""
    split = [r for r in runs if r["figures"].get("returns_by_pin_end")]
    if not split:
        return ""
    seen = {how for r in split for how in r["figures"]["returns_by_pin_end"]}
    ends = [h for h in PIN_ENDS_FIRST if h in seen]
    ends += sorted(seen - {*PIN_ENDS_FIRST, *PIN_ENDS_LAST}) + [h for h in PIN_ENDS_LAST if h in seen]
    head = ["N", "policy", "seed", *ends]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in split:
        by = r["figures"]["returns_by_pin_end"]
        cells = [f"{by[h]['lost']} / {by[h]['returns']}, {by[h]['tokens'] / 1e6:.2f}" if h in by else "-" for h in ends]
        lines.append("| " + " | ".join([str(r["sessions"]), r["policy"], str(r["seed"]), *cells]) + " |")
    return "\n".join(lines)


def plots(rows: list[dict], out: Path) -> list[Path]:
    """Throughput and TTFT p90 against N; none for a grid at one N (a point per policy says no
    more than the table)."""
    if len({r["sessions"] for r in rows}) < 2:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, title, name in (
        ("output_tokens_per_s", "output tokens/s (median over seeds)", "throughput.png"),
        ("ttft_p90_s", "TTFT p90 s (median over seeds)", "ttft-p90.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy in dict.fromkeys(r["policy"] for r in rows):
            points = sorted((r["sessions"], r[key]) for r in rows if r["policy"] == policy and r[key] is not None)
            if points:
                ax.plot(*zip(*points), marker="o", label=policy, linestyle="-" if HICACHE in policy else "--")
        ax.set_xlabel("sessions in flight (N)")
        ax.set_title(title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
