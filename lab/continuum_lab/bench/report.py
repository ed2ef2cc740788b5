"""Reports for ``continuum-bench``: summary statistics, the Markdown table, and the plots."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from continuum_lab.bench.replay import ReplayResult
from continuum_lab.harness.server import parse_metrics
from sglang_continuum.core.series import family_name, series_key

# report column -> the key parse_metrics gives the series (Continuum's from core/series.py)
PIN_SERIES = {
    "pin_hits": series_key("counters.hits"),
    "pin_expiries": series_key("counters.expired"),
    "pin_sheds": family_name("pin_sheds"),  # every reason
    "pins_created": series_key("counters.created"),
    "held_back": series_key("admission.held_back"),
    "overdue_admitted": series_key("admission.overdue_admitted"),
    "sheds_admission": series_key("sheds.admission"),
    "sheds_idle": series_key("sheds.idle"),
    "sheds_alloc": series_key("sheds.alloc"),
    "sheds_budget": series_key("sheds.budget"),
    "sheds_while_waiting": series_key("sheds.while_waiting"),
    # HiCache: SGLang's own count of tokens loaded back from host, and Continuum's offloads
    "host_loaded_tokens": "sglang:load_back_tokens_total",
    "offloads": series_key("host.offloaded"),
    "host_hit_tokens": series_key("host.host_hit_tokens"),
    "host_load_wait_s": series_key("host.load_wait_s"),
    # predictive upload and the tool call's gap lent to the queue
    "uploads_started": series_key("uploads.started"),
    "uploads_used": series_key("uploads.used"),
    "uploads_wasted": series_key("uploads.wasted"),
    "uploads_failed": series_key("uploads.failed"),
    "upload_tokens": series_key("uploads.tokens"),
    "sheds_gap": series_key("sheds.gap"),
}


# SGLang's own account of its scheduler loop's wall time by stage (--enable-metrics)
STAGE_SERIES = "sglang:scheduler_stage_seconds_total"
_CATEGORY = re.compile(r'category="([^"]+)"')


def scheduler_stage_seconds(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(STAGE_SERIES) and (m := _CATEGORY.search(line)):
            out[m[1]] = out.get(m[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def server_time(metrics_before: str, metrics_after: str) -> dict:
    """Where the server's scheduler spent the run: its forwards (``run_batch``), the rest of its
    busy loop (receiving, batching, processing results) and idle. SGLang adds to these series
    at intervals, so the split is approximate at the run's two ends. Empty without the series."""
    before, after = scheduler_stage_seconds(metrics_before), scheduler_stage_seconds(metrics_after)
    if not after:
        return {}
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    forward, idle = spent.get("run_batch", 0.0), spent.get("idle", 0.0)
    return {"server_forward_s": forward, "server_loop_s": sum(spent.values()) - forward - idle, "server_idle_s": idle}


def emulated_loops(runs) -> str:
    """Which of SGLang's scheduler loops emulated runs stepped (a run from before the emulator
    modelled overlap scheduling, read back with --reuse-runs, stepped the serial one)."""
    overlap = {bool((r.get("emulator") or {}).get("overlap")) for r in runs}
    names = {True: "its overlap loop, as a server runs it", False: "its serial loop (`--disable-overlap-schedule`)"}
    return " and ".join(names[o] for o in sorted(overlap, reverse=True))


def _wait(turn) -> float:
    """How long a turn waited in the server's queue (SGLang's queue_time, else its TTFT)."""
    return turn.queue_time_s if turn.queue_time_s is not None else turn.ttft


def summarize(result: ReplayResult) -> dict:
    """A run's figures. Only turns that reached their client count: a timed-out try's tokens do
    not (``bench/replay.py``), and a retried turn's wait and TTFT count from its first try's send.
    ``failed_programs``: those a failed turn stopped (every try timed out, or the server refused
    it); ``timed_out_programs``: of them, those a turn's timeouts stopped."""
    progs = result.programs
    jcts = np.array([p.jct for p in progs if p.ok], dtype=float)
    turns = [t for p in progs for t in p.turns]
    ok_turns = [t for t in turns if t.error is None]
    waits = [_wait(t) for t in ok_turns if t.ttft is not None]
    # a program's waits summed over its turns: a door concentrates them in one request, a
    # stock policy spreads them over every turn, and a program feels the sum
    program_waits = [sum(_wait(t) for t in p.turns if t.ttft is not None) for p in progs if p.ok]
    prompt = sum(t.prompt_tokens for t in ok_turns)
    cached = sum(t.cached_tokens for t in ok_turns)
    later = [t for t in ok_turns if t.turn > 0]  # turns that could find their program's context
    later_prompt = sum(t.prompt_tokens for t in later)
    out_tokens = sum(t.output_tokens for t in ok_turns)
    before = parse_metrics(result.metrics_before, prefix="sglang:")
    after = parse_metrics(result.metrics_after, prefix="sglang:")
    pct = (lambda q: float(np.percentile(jcts, q))) if jcts.size else (lambda q: float("nan"))
    return {
        "programs": len(progs),
        "failed_programs": sum(not p.ok for p in progs),
        "failed_requests": sum(t.error is not None for t in turns),
        "timeouts": sum(t.timeouts for t in turns),  # tries with no first token within the client timeout
        "retries": sum(t.retries for t in turns),
        "timed_out_programs": sum(p.timed_out for p in progs),
        "errors": sorted({t.error for t in turns if t.error})[:5],
        "jct_mean_s": float(jcts.mean()) if jcts.size else float("nan"),
        "jct_median_s": pct(50),
        "jct_p90_s": pct(90),
        "jct_p95_s": pct(95),
        "jct_p99_s": pct(99),
        "programs_per_s": len(jcts) / result.wall_s if result.wall_s else 0.0,
        "tokens_per_s": (prompt + out_tokens) / result.wall_s if result.wall_s else 0.0,
        "mean_turn_wait_s": float(np.mean(waits)) if waits else float("nan"),
        "max_request_wait_s": float(np.max(waits)) if waits else float("nan"),
        "max_program_wait_s": float(np.max(program_waits)) if program_waits else float("nan"),
        "p99_request_latency_s": float(np.percentile([t.finish - t.send for t in ok_turns if t.finish is not None], 99))
        if ok_turns
        else float("nan"),
        "mean_ttft_s": float(np.mean([t.ttft for t in ok_turns if t.ttft is not None])) if ok_turns else float("nan"),
        "cache_hit_ratio": cached / prompt if prompt else 0.0,
        "later_turn_cache_hit": sum(t.cached_tokens for t in later) / later_prompt if later_prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": out_tokens,
        "wall_s": result.wall_s,
        # time-averaged programs in the system (Little's law over the run: sum of JCTs / makespan)
        "programs_in_system": float(jcts.sum()) / result.wall_s if result.wall_s and jcts.size else 0.0,
        **{k: after.get(v, 0.0) - before.get(v, 0.0) for k, v in PIN_SERIES.items()},
        **counters_at(result.metrics_at, before),
        **server_time(result.metrics_before, result.metrics_after),
    }


EARLY_SERIES = ("pins_created", "pin_hits", "pin_expiries")


def counters_at(metrics_at: dict[str, str], before: dict) -> dict:
    """Pins made and hit by each mark (``pins_created_60s``...): how soon a fresh server pins."""
    out = {}
    for mark, text in metrics_at.items():
        then = parse_metrics(text, prefix="sglang:")
        for key in EARLY_SERIES:
            series = PIN_SERIES[key]
            out[f"{key}_{mark}s"] = then.get(series, 0.0) - before.get(series, 0.0)
    return out


COLUMNS = [
    ("policy", "policy", "{}"),
    ("jps", "jps", "{:g}"),
    ("jct_mean_s", "mean JCT s", "{:.2f}"),
    ("jct_median_s", "median", "{:.2f}"),
    ("jct_p90_s", "P90", "{:.2f}"),
    ("jct_p95_s", "P95", "{:.2f}"),
    ("jct_p99_s", "P99", "{:.2f}"),
    ("programs_per_s", "programs/s", "{:.3f}"),
    ("tokens_per_s", "tokens/s", "{:.0f}"),
    ("mean_turn_wait_s", "turn queue s", "{:.3f}"),
    ("max_request_wait_s", "max wait s", "{:.2f}"),
    ("max_program_wait_s", "longest program wait s", "{:.2f}"),
    ("p99_request_latency_s", "P99 request s", "{:.2f}"),
    ("cache_hit_ratio", "cache hit", "{:.1%}"),
    ("pin_hits", "pin hits", "{:.0f}"),
    ("pin_expiries", "expiries", "{:.0f}"),
    ("pin_sheds", "sheds", "{:.0f}"),
    ("sheds_while_waiting", "sheds w/ turn waiting", "{:.0f}"),
    ("programs_in_system", "programs in system", "{:.1f}"),
    ("overdue_admitted", "overdue", "{:.0f}"),
    ("host_loaded_tokens", "host-loaded tokens", "{:.0f}"),
    ("server_forward_s", "forward s", "{:.1f}"),
    ("server_loop_s", "rest of loop s", "{:.1f}"),
    ("timeouts", "timeouts", "{}"),
    ("retries", "retries", "{}"),
    ("failed_requests", "failed", "{}"),
    ("failed_programs", "failed programs", "{}"),
]


def baseline_of(policy: str, baseline: str = "fcfs") -> str:
    """A policy is compared with the baseline on the same cache tiers and behind the same router:
    ``x+hicache`` with ``fcfs+hicache``, ``x@round_robin`` with ``fcfs@round_robin``."""
    policy, at, router = policy.partition("@")
    _, plus, extra = policy.partition("+")
    return baseline + plus + extra + at + router


def markdown_table(rows: list[dict], baseline: str = "fcfs") -> str:
    """One line per run; with seeds, a seed column (``seed/rREPEAT`` after the first repeat,
    marked when the run collapsed) and ratios against the baseline's run on the same seed."""
    seeded = any("seed" in r for r in rows)
    head = (
        [c[1] for c in COLUMNS[:2]]
        + (["seed"] if seeded else [])
        + [c[1] for c in COLUMNS[2:]]
        + [f"mean JCT vs {baseline}", f"P95 vs {baseline}"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = {(r["jps"], r.get("seed"), r.get("repeat"), r["policy"]): r for r in rows}
    for r in rows:
        cells = [fmt.format(r[key]) if key in r else "-" for key, _, fmt in COLUMNS]  # "-": not measured
        if seeded:
            repeat = f"/r{r['repeat']}" if r.get("repeat") else ""
            cells.insert(2, f"{r.get('seed')}{repeat}{' (collapsed)' if r.get('collapsed') else ''}")
        b = base.get((r["jps"], r.get("seed"), r.get("repeat"), baseline_of(r["policy"], baseline)))
        for key in ("jct_mean_s", "jct_p95_s"):
            cells.append(f"{b[key] / r[key]:.2f}x" if b and r[key] and np.isfinite(r[key]) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plots(runs: list[dict], out_dir: Path) -> list[Path]:
    """JCT CDF and per-turn latency at the highest load (all seeds of a policy pooled), and the
    median mean JCT against load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    jps_values = sorted({r["jps"] for r in runs})
    focus = jps_values[-1]
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    at_focus = {p: [r for r in runs if r["policy"] == p and r["jps"] == focus] for p in policies}

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, group in at_focus.items():
        j = np.sort([p["jct"] for r in group for p in r["replay"]["programs"] if p["ok"]])
        ax.step(j, np.arange(1, len(j) + 1) / max(1, len(j)), where="post", label=policy)
    ax.set(xlabel="job completion time (s)", ylabel="fraction of programs", title=f"JCT CDF at {focus:g} jobs/s")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(save_figure(fig, out_dir / "jct_cdf.png"))

    def latency(t: dict):
        return t["finish"] - t["send"] if t["finish"] is not None else None

    def wait(t: dict):
        return t["queue_time_s"] if t.get("queue_time_s") is not None else t.get("ttft")

    for value, ylabel, title, name in (
        (latency, "mean turn latency (s)", "Per-turn latency", "turn_latency.png"),
        (wait, "mean queueing delay (s)", "Queueing delay per turn", "turn_queue.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy, group in at_focus.items():
            by_turn: dict[int, list[float]] = {}
            for r in group:
                for p in r["replay"]["programs"]:
                    for t in p["turns"]:
                        v = value(t) if t["error"] is None else None
                        if v is not None:
                            by_turn.setdefault(t["turn"], []).append(v)
            idx = sorted(by_turn)
            ax.plot(idx, [np.mean(by_turn[i]) for i in idx], marker="o", ms=3, label=policy)
        ax.set(xlabel="turn index", ylabel=ylabel, title=f"{title} at {focus:g} jobs/s")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(save_figure(fig, out_dir / name))

    if len(jps_values) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy in policies:
            pts = [
                (
                    j,
                    float(
                        np.median([r["summary"]["jct_mean_s"] for r in runs if r["policy"] == policy and r["jps"] == j])
                    ),
                )
                for j in jps_values
                if any(r["policy"] == policy and r["jps"] == j for r in runs)
            ]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        ax.set(xlabel="jobs per second", ylabel="mean JCT (s), median over seeds", title="Mean JCT vs load")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(save_figure(fig, out_dir / "jct_vs_jps.png"))
    return paths


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
