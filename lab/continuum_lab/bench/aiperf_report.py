"""``continuum-aiperf``'s report: AIPerf's own figures beside the server's, per run and per policy.

A run record is ``{"policy", "seed", "aiperf": {...}, "server": {...}}``:

* ``aiperf``: read from AIPerf's ``profile_export_aiperf.json`` (``aiperf_figures``), its measured
  phase only: TTFT p50/p90/p99, request latency p90, request and output-token throughput (over
  its benchmark duration: first request to last response, the grace period's answers included),
  requests completed and failed, and its one cache figure, ``overall_usage_prompt_cache_read_pct``
  (the servers' ``usage.prompt_tokens_details.cached_tokens`` over the prompt tokens).
* ``server``: the server's own ``/metrics`` over the same phase (``server_figures``: SGLang's
  cached / prompt tokens, its generated tokens per second, the plugin's pins and the
  ``id_source`` of the requests it saw, and the prices residency read at the phase's end: whether
  growth was reserved, the decode share and the release loss, which say why it pinned what it did).

Per policy over seeds (``aggregate``): the median, the spread (lowest to highest) and the worst
seed of each figure, and each non-stock policy's output throughput and TTFT p90 against the best
stock policy (highest median output throughput) on the same seed.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from continuum_lab.bench.report import PIN_SERIES
from continuum_lab.bench.seeds import is_stock
from sglang_continuum.core.series import series_key

ID_SOURCES = ("program_id", "session_id", "routing_key", "inferred", "first_turn", "none")

# (figure, column title, format, higher is better): AIPerf's, then the server's
AIPERF_COLUMNS = (
    ("output_tokens_per_s", "output tok/s", "{:.1f}", True),
    ("requests_per_s", "requests/s", "{:.2f}", True),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}", False),
    ("ttft_p90_s", "TTFT p90 s", "{:.2f}", False),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}", False),
    ("cache_read_pct", "cache read %", "{:.1f}", True),
    ("requests", "requests", "{:.0f}", True),
    ("failed_requests", "failed", "{:.0f}", False),
)
SERVER_COLUMNS = (
    ("output_tokens_per_s", "server output tok/s", "{:.1f}", True),
    ("cache_hit", "SGLang cached", "{:.1%}", True),
    ("pins_created", "pins", "{:.0f}", True),
    ("pin_hits", "pin hits", "{:.0f}", True),
    ("requests_routing_key", "routing-key requests", "{:.0f}", True),
    ("requests_inferred", "inferred", "{:.0f}", True),
)

# the plugin's prices at the measured phase's end (gauges: their last value, not a change)
PRICE_COLUMNS = (
    ("growth_reserved_end", series_key("gauge.growth_reserved"), "growth reserved", "{:.0f}"),
    ("decode_share_end", series_key("gauge.decode_share_ratio"), "decode share", "{:.2f}"),
    ("release_loss_end", series_key("gauge.release_loss_ratio"), "release loss", "{:.2f}"),
)


def _stat(metric: Optional[dict], key: str, scale: float = 1.0) -> Optional[float]:
    if not isinstance(metric, dict) or metric.get(key) is None:
        return None
    return float(metric[key]) * scale


def aiperf_figures(aggregate: dict) -> dict:
    """The figures the report compares, from AIPerf's aggregate export (times in seconds)."""
    ttft = aggregate.get("time_to_first_token")
    ms = 1e-3 if (ttft or {}).get("unit", "ms") == "ms" else 1.0
    latency = aggregate.get("request_latency")
    return {
        "output_tokens_per_s": _stat(aggregate.get("output_token_throughput"), "avg"),
        "requests_per_s": _stat(aggregate.get("request_throughput"), "avg"),
        "ttft_p50_s": _stat(ttft, "p50", ms),
        "ttft_p90_s": _stat(ttft, "p90", ms),
        "ttft_p99_s": _stat(ttft, "p99", ms),
        "request_latency_p90_s": _stat(latency, "p90", 1e-3 if (latency or {}).get("unit", "ms") == "ms" else 1.0),
        "cache_read_pct": _stat(aggregate.get("overall_usage_prompt_cache_read_pct"), "avg"),
        "requests": _stat(aggregate.get("request_count"), "avg"),
        "failed_requests": _stat(aggregate.get("error_request_count"), "avg") or 0.0,
        "prompt_tokens": _stat(aggregate.get("total_usage_prompt_tokens"), "avg"),
        "cache_read_tokens": _stat(aggregate.get("total_usage_prompt_cache_read_tokens"), "avg"),
        "benchmark_duration_s": _stat(aggregate.get("benchmark_duration"), "avg"),
        "aiperf_version": aggregate.get("aiperf_version"),
        "complete": bool(aggregate.get("is_complete", True)) and not aggregate.get("was_cancelled", False),
    }


def server_figures(window: Optional[dict]) -> dict:
    """The server's counters over AIPerf's measured phase (``MetricsWatch.window``)."""
    if not window:
        return {}
    d = window["delta"]
    seconds = window["to_s"] - window["from_s"]
    prompt, cached = d.get("sglang:prompt_tokens_total", 0.0), d.get("sglang:cached_tokens_total", 0.0)
    out = {
        "window_s": seconds,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit": cached / prompt if prompt else None,
        "generated_tokens": d.get("sglang:generation_tokens_total", 0.0),
        "output_tokens_per_s": d.get("sglang:generation_tokens_total", 0.0) / seconds if seconds > 0 else None,
        "requests": d.get("sglang:num_requests_total", 0.0),
        "cache_hit_rate_gauge_end": window["end"].get("sglang:cache_hit_rate"),
    }
    if "sglang:continuum_requests_total" in d:  # the plugin is loaded: its pins and who it saw
        out |= {key: d.get(series, 0.0) for key, series in PIN_SERIES.items()}
        for source in ID_SOURCES:
            out[f"requests_{source}"] = d.get(f'sglang:continuum_requests_total{{id_source="{source}"}}', 0.0)
        out |= {key: window["end"].get(series) for key, series, _, _ in PRICE_COLUMNS}
    return out


def _values(runs: list[dict], part: str, key: str) -> list[tuple[int, float]]:
    return [(r["seed"], r[part][key]) for r in runs if r.get(part, {}).get(key) is not None]


def spread(runs: list[dict], part: str, key: str, higher_is_better: bool) -> Optional[dict]:
    """Median, lowest, highest and the worst seed of one figure over a policy's runs."""
    values = _values(runs, part, key)
    if not values:
        return None
    numbers = [v for _, v in values]
    worst = (min if higher_is_better else max)(values, key=lambda sv: sv[1])
    return {"median": float(np.median(numbers)), "min": min(numbers), "max": max(numbers), "worst_seed": worst[0],
            "worst": worst[1]}  # fmt: skip


def best_stock(runs: list[dict]) -> Optional[str]:
    """The stock policy with the highest median AIPerf output throughput."""
    medians = {}
    for policy in dict.fromkeys(r["policy"] for r in runs if is_stock(r["policy"])):
        s = spread([r for r in runs if r["policy"] == policy], "aiperf", "output_tokens_per_s", True)
        if s is not None:
            medians[policy] = s["median"]
    return max(medians, key=medians.get) if medians else None


def ratios(runs: list[dict], policy: str, other: str, key: str) -> list[float]:
    """``policy``'s AIPerf figure / ``other``'s on the same seed."""
    by = {(r["policy"], r["seed"]): r["aiperf"].get(key) for r in runs}
    return [
        v / by[(other, seed)]
        for (p, seed), v in by.items()
        if p == policy and v is not None and by.get((other, seed)) not in (None, 0)
    ]


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per policy, in run order."""
    stock = best_stock(runs)
    rows = []
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        row: dict = {"policy": policy, "seeds": [r["seed"] for r in mine]}
        row["aiperf"] = {k: spread(mine, "aiperf", k, better) for k, _, _, better in AIPERF_COLUMNS}
        row["server"] = {k: spread(mine, "server", k, better) for k, _, _, better in SERVER_COLUMNS}
        if stock and not is_stock(policy):
            tput = ratios(runs, policy, stock, "output_tokens_per_s")
            ttft = ratios(runs, policy, stock, "ttft_p90_s")
            row["best_stock"] = stock
            row["vs_best_stock_output"] = {"median": float(np.median(tput)), "worst": min(tput)} if tput else None
            row["vs_best_stock_ttft_p90"] = {"median": float(np.median(ttft)), "worst": max(ttft)} if ttft else None
        rows.append(row)
    return rows


def _cell(s: Optional[dict], fmt: str, with_spread: bool = True) -> str:
    if s is None:
        return "-"
    if not with_spread or s["min"] == s["max"]:
        return fmt.format(s["median"])
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def _versus(row: dict) -> str:
    tput, ttft = row.get("vs_best_stock_output"), row.get("vs_best_stock_ttft_p90")
    if not tput:
        return "-"
    text = f"{tput['median']:.2f}x ({tput['worst']:.2f}x) vs {row['best_stock']}"
    if ttft:
        text += f"; TTFT p90 {ttft['median']:.2f}x ({ttft['worst']:.2f}x)"
    return text


def policy_table(rows: list[dict]) -> str:
    """Per policy: medians (spread over seeds), AIPerf's output throughput's worst seed, and the
    ratio against the best stock policy."""
    head = ["policy", "seeds", *(t for _, t, _, _ in AIPERF_COLUMNS[:6]), "worst seed (output tok/s)",
            *(t for _, t, _, _ in SERVER_COLUMNS), "vs best stock: output tok/s, worst seed; TTFT p90"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        a, s = row["aiperf"], row["server"]
        worst = a["output_tokens_per_s"]
        cells = [
            f"**{row['policy']}**" if row["policy"].startswith("continuum") else row["policy"],
            ", ".join(map(str, row["seeds"])),
            *(_cell(a[k], f) for k, _, f, _ in AIPERF_COLUMNS[:6]),
            f"{worst['worst']:.1f} (seed {worst['worst_seed']})" if worst else "-",
            *(_cell(s[k], f, with_spread=False) for k, _, f, _ in SERVER_COLUMNS),
            _versus(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_table(runs: list[dict]) -> str:
    """Every run, in the order it ran."""
    head = ["seed", "policy", *(t for _, t, _, _ in AIPERF_COLUMNS), *(t for _, t, _, _ in SERVER_COLUMNS),
            *(f"{t} (end)" for _, _, t, _ in PRICE_COLUMNS), "exit"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        a, s = r.get("aiperf", {}), r.get("server", {})
        cells = [str(r["seed"]), r["policy"]]
        cells += ["-" if a.get(k) is None else f.format(a[k]) for k, _, f, _ in AIPERF_COLUMNS]
        cells += ["-" if s.get(k) is None else f.format(s[k]) for k, _, f, _ in SERVER_COLUMNS]
        cells += ["-" if s.get(k) is None else f.format(s[k]) for k, _, _, f in PRICE_COLUMNS]
        lines.append("| " + " | ".join([*cells, str(r.get("exit"))]) + " |")
    return "\n".join(lines)
