"""The hostile probe's judgement and table: per pattern, what the honest programs kept on the
continuum server and on the fcfs reference (each as the attack's ratio to its own baseline, and
continuum's ratio over fcfs's: what the plugin itself loses or gains under the attack), what they
lost to another client (the continuum server's event log), and whether each server stayed healthy."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from continuum_lab.cli.reliability.common import ProbeResult, rnd
from continuum_lab.cli.reliability.hostile_attacks import FINDING

TARGET = 0.95  # the honest programs keep >= 0.95x their throughput and cached share
NO_PIN = ("none", "refused", "None")  # a later turn whose previous turn left no pin


def losses(events: dict[str, dict], rids: list[str], attack_turns: list) -> dict:
    """What the server says of the honest later turns (the event log, by rid): seen as a new
    program's first turn (ended or dropped by someone else), what became of their previous turn's
    pin; and how many of the attacker's turns naming an honest id were logged in that honest
    program (the same program id as its own turns: the attacker joined it)."""
    recs = [events[r] for r in rids if r in events]
    pin_end = Counter(str(r.get("pin_end")) for r in recs)
    logged = {rid.rsplit("-t", 1)[0]: events[rid].get("program_id") for rid in rids if rid in events}
    joined: Counter = Counter()
    for rid, pid in attack_turns:
        if rid in events and pid in logged and events[rid].get("program_id") == logged[pid]:
            joined[rid.split("-", 1)[0]] += 1
    return {
        "logged": len(recs),
        "restarted": sum(1 for r in recs if r.get("turn") == 1),
        "held_back": sum(1 for r in recs if r.get("held_back")),
        "pin_hit": sum(1 for r in recs if r.get("pin_hit")),
        "pins_created": sum(v for k, v in pin_end.items() if k not in NO_PIN),
        "pin_released": pin_end.get("released", 0),
        "pin_shed": sum(v for k, v in pin_end.items() if k.startswith("shed")),
        "pin_end": dict(pin_end),
        "attack_turns_logged": sum(1 for rid, _ in attack_turns if rid in events),
        "attack_turns_joined": sum(joined.values()),
        "attack_turns_joined_by_kind": dict(joined),
    }


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 3) if a is not None and b else None


def healthy(ph: dict) -> bool:
    return bool(ph["alive"] and ph["health"] and ph["tracebacks"] == 0 and ph["honest"]["failed"] == 0)


def judge(res: ProbeResult, rows: list[dict]) -> None:
    """Each row: ``pattern``, ``phase`` / ``baseline`` (continuum), ``losses`` / ``baseline_losses``,
    ``fcfs`` / ``fcfs_baseline`` (None with ``fcfs_skipped``: why)."""
    table = []
    for row in rows:
        ph, base, lo, blo = row["phase"], row["baseline"], row["losses"], row["baseline_losses"]
        fph, fb = row.get("fcfs"), row.get("fcfs_baseline")
        h, b, atk = ph["honest"], base["honest"], ph["attack"]
        res.sent += h["turns"] + int(atk.get("sent") or 0)
        res.failed += h["failed"]
        tput, cached = ratio(h["tok_s"], b["tok_s"]), ratio(h["cached_share"], b["cached_share"])
        f_tput = ratio(fph["honest"]["tok_s"], fb["honest"]["tok_s"]) if fph else None
        f_cached = ratio(fph["honest"]["cached_share"], fb["honest"]["cached_share"]) if fph else None
        lost = {k: lo[k] - blo[k] for k in ("restarted", "pin_released", "pin_shed")}
        name = row["pattern"]
        out = {
            "pattern": name,
            "finding": FINDING[name],
            "attack": {k: v for k, v in atk.items() if k != "errors"},
            "attack_errors": atk.get("errors", []),
            "honest": h,
            "baseline": b,
            "tput_ratio": tput,
            "cached_ratio": cached,
            "fcfs_tput_ratio": f_tput,
            "fcfs_cached_ratio": f_cached,
            "tput_quotient": ratio(tput, f_tput),
            "cached_quotient": ratio(cached, f_cached),
            "fcfs": _fcfs_view(fph, fb),
            "fcfs_skipped": row.get("fcfs_skipped"),
            "losses": lo,
            "baseline_losses": blo,
            "lost_beyond_baseline": lost,
            "counters": ph["counters"],
            "baseline_counters": base["counters"],
            "gauges": ph["gauges"],
            "baseline_gauges": base["gauges"],
            "alive": ph["alive"],
            "health": ph["health"],
            "tracebacks": ph["tracebacks"],
            "healthy": healthy(ph),
            "fcfs_healthy": healthy(fph) if fph else None,
            "scoped": row["scoped"],
        }
        misses = _misses(out)
        out["targets_missed"] = misses
        table.append(out)
        if misses:
            res.notes.append(f"{name} ({FINDING[name]}): target missed: {'; '.join(misses)}")
        _problems(res, name, ph, atk)
        if fph and not out["fcfs_healthy"]:
            res.notes.append(f"{name}: the fcfs reference was not healthy: {_fcfs_view(fph, fb)}")
    res.details["rows"] = table
    gaps = [r["honest"]["itl_max_ms"] for r in table if r["honest"]["itl_max_ms"] is not None]
    res.max_wait_s = rnd(max(gaps) / 1000 if gaps else None, 3)


def _fcfs_view(fph: Optional[dict], fb: Optional[dict]) -> Optional[dict]:
    if not fph:
        return None
    keys = ("alive", "health", "tracebacks")
    return {"honest": fph["honest"], "baseline": fb["honest"], "attack": fph["attack"], **{k: fph[k] for k in keys}}


def _misses(r: dict) -> list[str]:
    misses = []
    q = r["tput_quotient"] if r["tput_quotient"] is not None else r["tput_ratio"]
    if q is not None and q < TARGET:
        what = "throughput against fcfs's" if r["tput_quotient"] is not None else "throughput (no fcfs reference)"
        misses.append(f"{what} {q:.2f}x")
    if r["cached_ratio"] is not None and r["cached_ratio"] < TARGET:
        misses.append(f"cached share {r['cached_ratio']:.2f}x")
    if r["scoped"] and any(v > 0 for v in r["lost_beyond_baseline"].values()):
        misses.append("lost " + ", ".join(f"{k} {v}" for k, v in r["lost_beyond_baseline"].items() if v > 0))
    if r["scoped"] and r["losses"]["attack_turns_joined"]:
        misses.append(f"{r['losses']['attack_turns_joined']} attacker turns joined honest programs")
    return misses


def _problems(res: ProbeResult, name: str, ph: dict, atk: dict) -> None:
    h = ph["honest"]
    if not ph["alive"]:
        res.server_died = True
        res.problem(f"{name}: the server died")
    elif not ph["health"]:
        res.problem(f"{name}: /health failed after the attack")
    if ph["tracebacks"]:
        res.problem(f"{name}: {ph['tracebacks']} traceback(s) in the server log")
    if h["failed"]:
        res.problem(f"{name}: {h['failed']} honest request(s) failed: {h['errors']}")
    if "attack_error" in atk:
        res.problem(f"{name}: the attack could not run: {atk['attack_error']}")


def _f(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _peak(gauges: dict, name: str, which: str = "max") -> Any:
    return gauges.get(name, {}).get(which)


def _n(c: dict, key: str) -> str:
    return f"{c.get(key) or 0:.0f}"


def pattern_note(r: dict) -> str:
    a, g, c, lo = r["attack"], r["gauges"], r["counters"], r["losses"]
    name = r["pattern"]
    if name == "identical_prompts":
        return f"requests inferred {_n(c, 'requests_inferred')}, first-turn {_n(c, 'requests_first_turn')}, none {_n(c, 'requests_without_program')}"
    if name == "distinct_ids":
        return f"tracked programs peak {_f(_peak(g, 'tracked_programs'), 0)}; forgotten {_n(c, 'programs_forgotten')}"
    if name == "held_turns":
        return (
            f"held back peak {_f(_peak(g, 'programs_held_back'), 0)}, queue peak {_f(_peak(g, 'sglang_num_queue_reqs'), 0)}; "
            f"{a.get('served_within_hold')} served within {a.get('attack_s')} s"
        )
    if name.startswith("ending_others"):
        return (
            f"{'scoped: tenant header on' if r['scoped'] else 'no tenant header (the default: ids shared)'}; "
            f"actions {a.get('actions')}; attacker turns logged in an honest program {lo['attack_turns_joined']}"
            f"/{lo['attack_turns_logged']}; programs ended by last step {_n(c, 'programs_ended_last_step')}, "
            f"released {_n(c, 'programs_released')}"
        )
    if name == "tiny_programs":
        bg = r["baseline_gauges"]
        return (
            f"expected final context {_f(_peak(bg, 'expected_final_context_tokens', 'min'), 0)} -> "
            f"min {_f(_peak(g, 'expected_final_context_tokens', 'min'), 0)}; growth reserved min "
            f"{_f(_peak(g, 'growth_reserved', 'min'), 0)} (base {_f(_peak(bg, 'growth_reserved', 'min'), 0)})"
        )
    if name == "peer_stats":
        return (
            f"messages {a.get('messages')}; peer samples received {_n(c, 'stats_samples_received')} "
            f"(of them {a.get('control_samples')} sound control samples)"
        )
    if name == "bad_metadata_rate":
        return f"malformed log lines {a.get('malformed_log_lines')} for {a.get('sent')} requests"
    return ""


def report_table(rows: list[dict]) -> str:
    """The per-pattern table (markdown) that the report shows."""
    head = (
        "| pattern | attack sent (/s) | continuum honest tok/s attack / base | ratio | fcfs honest tok/s attack / base "
        "| ratio | continuum / fcfs | cached share ratio continuum / fcfs | ITL p99 ms continuum (base) | "
        "honest later turns restarted (base) | honest pins created / released / shed (base) | healthy continuum / fcfs "
        "| what the server showed |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        h, b, a, lo, blo, f = r["honest"], r["baseline"], r["attack"], r["losses"], r["baseline_losses"], r["fcfs"]
        per_s = f" ({a['per_s']:.0f}/s)" if a.get("per_s") else ""
        fcfs_tok = (
            f"{_f(f['honest']['tok_s'], 1)} / {_f(f['baseline']['tok_s'], 1)}" if f else f"- ({r['fcfs_skipped']})"
        )
        fh = "-" if r["fcfs_healthy"] is None else ("yes" if r["fcfs_healthy"] else "**no**")
        lines.append(
            f"| {r['pattern']} ({r['finding']}) | {a.get('sent')}{per_s} in {a.get('attack_s')} s | "
            f"{_f(h['tok_s'], 1)} / {_f(b['tok_s'], 1)} | {_f(r['tput_ratio'])} | {fcfs_tok} | {_f(r['fcfs_tput_ratio'])} | "
            f"**{_f(r['tput_quotient'])}** | {_f(r['cached_ratio'])} / {_f(r['fcfs_cached_ratio'])} | "
            f"{_f(h['itl_p99_ms'], 0)} ({_f(b['itl_p99_ms'], 0)}) | {lo['restarted']} ({blo['restarted']}) | "
            f"{lo['pins_created']} / {lo['pin_released']} / {lo['pin_shed']} ({blo['pins_created']} / "
            f"{blo['pin_released']} / {blo['pin_shed']}) | {'yes' if r['healthy'] else '**no**'} / {fh} | "
            f"{pattern_note(r).replace('|', '/')} |"
        )
    return "\n".join(lines)
