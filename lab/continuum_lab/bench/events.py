"""Reading the server's event log (``event_log``; ``sglang_continuum/core/event_log.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from sglang_continuum.core.event_log import ADMITTED, ATTRIBUTED

# what a report shows of each of the slowest requests (``get``: logs written before a field existed)
SLOWEST_FIELDS = ("rid", "program_id", "turn", "wait_s", "overtaken", "overtake_budget", "overdue", "held_back")


def read_events(path: Path, event: str) -> list[dict]:
    """The records of one kind; a truncated last line (a killed server) is skipped."""
    records = []
    if not Path(path).is_file():
        return records
    for line in Path(path).read_bytes().splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("event") == event:
            records.append(row)
    return records


def read_admission_log(path: Path) -> list[dict]:
    return read_events(path, ADMITTED)


def read_attributions(path: Path) -> list[dict]:
    return read_events(path, ATTRIBUTED)


def summarize_admissions(records: list[dict], *, slowest: int = 10) -> dict:
    """What the report shows of a run's records: shares, waits by turn index, the slowest."""
    if not records:
        return {}
    waits = np.array([r["wait_s"] for r in records], dtype=float)
    first = [r["wait_s"] for r in records if r["turn"] == 1 and r["program_id"] is not None]
    later = [r["wait_s"] for r in records if r["turn"] > 1]
    worst = sorted(records, key=lambda r: r["wait_s"], reverse=True)[:slowest]
    return {
        "requests": len(records),
        "overdue_share": float(np.mean([r["overdue"] for r in records])),
        "held_back_share": float(np.mean([r["held_back"] for r in records])),
        "pin_hit_share": float(np.mean([r["pin_hit"] for r in records])),
        "max_wait_s": float(waits.max()),
        "p99_wait_s": float(np.percentile(waits, 99)),
        "mean_wait_first_turn_s": float(np.mean(first)) if first else 0.0,
        "mean_wait_later_turns_s": float(np.mean(later)) if later else 0.0,
        "max_overtaken": int(max(r["overtaken"] for r in records)),
        "slowest": [{k: r.get(k) for k in SLOWEST_FIELDS} for r in worst],
    }
