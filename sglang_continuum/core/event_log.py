"""The event log (``event_log``): one JSON line per admitted request and per program inferred.

``{"event": "admitted", "rid", "t", ...AdmissionRecord}``: which requests waited and why (how
long, overtaken how often against what budget, overdue, held back by admission control, pin hit).
``{"event": "attributed", "rid", "program_id", "source"}``: the program a request with no id was
attributed to (``source`` "inferred": a continuation found by prefix; "none": no program).
Written by the scheduler (buffered, flushed when the engine idles and at shutdown), read by the
lab's benchmarks. A debugging aid, off by default: bounded by ``max_records`` so a forgotten
setting cannot fill a disk, and a write that fails (a full disk) turns it off with one error
instead of reaching the scheduler loop.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import IO, Optional

import orjson

from sglang_continuum.core.turns import AdmissionRecord

logger = logging.getLogger(__name__)
ADMITTED, ATTRIBUTED = "admitted", "attributed"


class EventLog:
    def __init__(self, path: str, *, max_records: int = 1_000_000) -> None:
        self.path = Path(path)
        self.max_records = max_records
        self.written = 0
        self._file: Optional[IO[bytes]] = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed by close())
        except OSError as exc:
            logger.error("continuum: event log off: cannot write %s (%s)", self.path, exc)

    @property
    def on(self) -> bool:
        return self._file is not None and self.written < self.max_records

    def admitted(self, rid: str, now: float, record: AdmissionRecord) -> None:
        if self.on:
            self._write({"event": ADMITTED, "rid": rid, "t": now, **asdict(record)})

    def attributed(self, rid: Optional[str], program_id: str, source: str) -> None:
        if self.on:
            self._write({"event": ATTRIBUTED, "rid": rid, "program_id": program_id, "source": source})

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                self._off(exc)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                logger.error("continuum: event log %s: %s", self.path, exc)
            self._file = None

    def _write(self, line: dict) -> None:
        try:
            self._file.write(orjson.dumps(line) + b"\n")
        except (OSError, TypeError) as exc:
            self._off(exc)
            return
        self.written += 1

    def _off(self, exc: Exception) -> None:
        logger.error("continuum: event log off: writing %s failed (%s)", self.path, exc)
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None
