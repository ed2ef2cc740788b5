"""What a fleet run reports: per-run summary, attribution score, the report files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

from continuum_lab.bench.attribution import read_log, score, turn_rid
from continuum_lab.cli.agents.tasks import IDENTITY_SERIES, PIN_SERIES, TTL_SERIES, TaskResult


def score_attribution(results: list[TaskResult], log_path: Path) -> dict:
    """The server's attribution (``event_log``, keyed by ``rid``) against the truth the
    client knows: which task each request belonged to, in order. Scored by ``bench/attribution.py``
    (the same scorer as ``continuum-bench --no-ids``) after renaming each logged rid to
    ``<program>#<turn>``."""
    log = read_log(log_path)
    named: dict[str, tuple[str, str]] = {}
    for r in results:
        for i, turn in enumerate(r.turns):
            if turn.rid is not None and turn.rid in log:
                named[turn_rid(r.program_id, i)] = log[turn.rid]
    return score([(r.program_id, len(r.turns)) for r in results], named)


def summarize(results: list[TaskResult], metrics_delta: dict, pins_left: float) -> dict:
    later = [t for r in results for t in r.turns[1:]]  # turn index > 0 of each task
    prompt = sum(t.prompt_tokens for t in later)
    fractions = [t.cached_tokens / t.prompt_tokens for t in later if t.prompt_tokens]
    ttl_count = metrics_delta.get(f"{TTL_SERIES}_count", 0.0)
    tool_times = [t.tool_s for r in results for t in r.turns if t.tool_s is not None]
    return {
        "tasks": len(results),
        "ended": sum(r.ended for r in results),
        "exit_statuses": {
            s: sum(r.exit_status == s for r in results) for s in sorted({r.exit_status for r in results})
        },
        "mean_jct_s": statistics.fmean(r.jct_s for r in results) if results else 0.0,
        "max_jct_s": max((r.jct_s for r in results), default=0.0),
        "mean_steps": statistics.fmean(r.steps for r in results) if results else 0.0,
        "model_calls": sum(len(r.turns) for r in results),
        "later_turns": len(later),
        "later_turn_cached_fraction": sum(t.cached_tokens for t in later) / prompt if prompt else 0.0,
        "later_turns_with_cache": sum(t.cached_tokens > 0 for t in later) / len(later) if later else 0.0,
        "later_turn_mean_cached_fraction": statistics.fmean(fractions) if fractions else 0.0,
        "requests_by_source": {s: metrics_delta.get(name, 0.0) for s, name in IDENTITY_SERIES.items()},
        **{k: metrics_delta.get(name, 0.0) for k, name in PIN_SERIES.items()},
        "ttl_decisions": ttl_count,
        "mean_ttl_s": metrics_delta.get(f"{TTL_SERIES}_sum", 0.0) / ttl_count if ttl_count else None,
        "tool_calls": len(tool_times),
        "mean_tool_s": statistics.fmean(tool_times) if tool_times else 0.0,
        "pins_left_at_end": pins_left,
        "metrics_delta": metrics_delta,
    }


def write_report(out: Path, runs: list[dict], args, command: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "tool": "continuum-agents",
        "command": command,
        "mode": args.mode,
        "grammar": args.grammar,
        "identity": getattr(args, "identity", "ids"),
        "concurrency": args.concurrency,
        "step_limit": args.step_limit,
        "temperature": args.temperature,
        "runs": runs,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    lines = [
        "# continuum-agents",
        "",
        *([f"Command: `{command}`", ""] if command else []),
        f"mini-swe-agent 2.4.6 ({args.mode} mode{', grammar-forced commands' if args.grammar else ''}, "
        f"temperature {args.temperature:g}), "
        f"concurrency {args.concurrency}, step limit {args.step_limit}.",
        "",
        "| run | tasks ended | mean JCT (s) | max JCT (s) | makespan (s) | mean steps | cached fraction, later turns | tool calls | mean tool time (s) | pins left |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        lines.append(
            f"| {run['label']} | {s['ended']}/{s['tasks']} | {s['mean_jct_s']:.1f} | {s['max_jct_s']:.1f} | "
            f"{s['makespan_s']:.1f} | {s['mean_steps']:.1f} | {s['later_turn_cached_fraction']:.3f} | "
            f"{s['tool_calls']} | {s['mean_tool_s']:.3f} | {s['pins_left_at_end']:.0f} |"
        )
    lines += identity_section(runs)
    lines += [
        "",
        "Per task:",
        "",
        "| run | task | exit | steps | JCT (s) | commands (tool time s) |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        for t in run["tasks"]:
            cmds = "; ".join(f"`{x['command']}` ({x['tool_s']:.3f})" for x in t["turns"] if x["command"])
            lines.append(
                f"| {run['label']} | {t['task']} | {t['exit_status']} | {t['steps']} | {t['jct_s']:.1f} | {cmds} |"
            )
    (out / "report.md").write_text("\n".join(lines) + "\n")


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def identity_section(runs: list[dict]) -> list[str]:
    """Program identity per run: what the server was told (or inferred), and what it did with it."""
    lines = [
        "",
        "Program identity (`ids`: every request carries its task's program id as `custom_params.program_id`, "
        "`session_id` and `X-SMG-Routing-Key`, and the run ends with `/close_session`; `plain`: mini-swe-agent's "
        "stock model class, no program metadata, programs inferred by the server from the prefix). Requests per "
        "identity source are `/metrics` deltas (the most trusted source present counts); later turns are model "
        "calls after a task's first.",
        "",
        "| run | identity | model calls | requests by program_id / session_id / routing_key / inferred / first_turn / none "
        "| later turns | with cached tokens | mean cached fraction | pins made | pin hits | pin expiries "
        "| mean TTL decided (s) | pins left | attribution recall | attribution precision |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        by = s.get("requests_by_source", {})
        sources = " / ".join(f"{by.get(k, 0.0):.0f}" for k in IDENTITY_SERIES)
        a = s.get("attribution") or {}
        lines.append(
            f"| {run['label']} | {run.get('identity', 'ids')} | {s.get('model_calls', 0)} | {sources} "
            f"| {s.get('later_turns', 0)} | {_pct(s.get('later_turns_with_cache'))} "
            f"| {s.get('later_turn_mean_cached_fraction', 0.0):.3f} | {s.get('pins_created', 0.0):.0f} "
            f"| {s.get('pin_hits', 0.0):.0f} | {s.get('pin_expiries', 0.0):.0f} | {_num(s.get('mean_ttl_s'))} "
            f"| {s['pins_left_at_end']:.0f} "
            f"| {_pct(a.get('recall'))} | {_pct(a.get('precision'))} |"
        )
    if any("attribution" in r["summary"] for r in runs):
        lines += [
            "",
            "Attribution (plain runs on a server started here, `SGLANG_CONTINUUM_EVENT_LOG`): each request's "
            "SGLang `rid` is its response's `id`, so the client knows which task and turn it was; recall = turns "
            "after a task's first attributed to the program its previous turn was attributed to; precision = of "
            "the requests the server attributed to an earlier program, those it got right (`bench/attribution.py`).",
        ]
    return lines
