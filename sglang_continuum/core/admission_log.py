"""Per-request admission records (``admission_log_path``): which requests waited, and why.

One JSON line per admitted request: its program and turn index, how long it waited, how many
later arrivals were admitted ahead of it and how many would make it overdue (its overtaking
budget), whether it was overdue, held back by admission control or let past it. Written by the
scheduler (buffered, flushed when the engine idles and at shutdown), read by the benchmark and
the reliability suite. A debugging aid, off by default; bounded by ``max_records`` so a forgotten
setting cannot fill a disk.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import IO, Optional

import numpy as np
import orjson

from sglang_continuum.core.turns import AdmissionRecord

logger = logging.getLogger(__name__)
# what a report shows of each of the slowest requests (``get``: logs written before a field existed)
SLOWEST_FIELDS = (
    "rid",
    "program_id",
    "turn",
    "wait_s",
    "overtaken",
    "overtake_budget",
    "overdue",
    "held_back",
    "bypassed",
)


class AdmissionLog:
    def __init__(self, path: str, *, max_records: int = 1_000_000) -> None:
        self.path = Path(path)
        self.max_records = max_records
        self.written = 0
        self._file: Optional[IO[bytes]] = None
        try:  # a debugging aid: a path that cannot be written is reported, never fatal
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        except OSError as exc:
            logger.error("continuum: admission log off: cannot write %s (%s)", self.path, exc)

    def write(self, rid: str, now: float, record: AdmissionRecord) -> None:
        if self._file is None or self.written >= self.max_records:
            return
        self._file.write(orjson.dumps({"rid": rid, "t": now, **asdict(record)}) + b"\n")
        self.written += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_admission_log(path: Path) -> list[dict]:
    """The records of a log; a truncated last line (a killed server) is skipped."""
    records = []
    if not Path(path).is_file():
        return records
    for line in Path(path).read_bytes().splitlines():
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return records


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
        "bypassed": int(sum(r["bypassed"] for r in records)),
        "pin_hit_share": float(np.mean([r["pin_hit"] for r in records])),
        "max_wait_s": float(waits.max()),
        "p99_wait_s": float(np.percentile(waits, 99)),
        "mean_wait_first_turn_s": float(np.mean(first)) if first else 0.0,
        "mean_wait_later_turns_s": float(np.mean(later)) if later else 0.0,
        "max_overtaken": int(max(r["overtaken"] for r in records)),
        "slowest": [{k: r.get(k) for k in SLOWEST_FIELDS} for r in worst],
    }
