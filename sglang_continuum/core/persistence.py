"""Warm start: tool statistics saved to and loaded from a JSON file, without ever hurting serving.

The paper's agents are post-trained with their tools, so duration statistics exist before
serving. The same file doubles as the endpoint-free dump of the current statistics.

* Loading validates the file against a schema: a missing file is a cold start; a truncated,
  unreadable or wrongly shaped one is reported and ignored (the server starts cold). Its entries
  then meet the bounds live samples meet (``ToolStats.load_dict``: at most ``max_tools`` tools,
  names a client could send, durations in [0, ``MAX_DURATION_S``], outcomes 0 or 1): an entry
  out of bounds is left out and counted, and the rest loads.
* Saving never runs on the scheduler's step: the step hands a snapshot to ``StatsSaver``'s
  thread (a one-slot handoff: a newer snapshot replaces one not yet written) and moves on.
  Every failure is logged once per kind and counted; serving goes on.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)


class ToolStatsFile(BaseModel):
    """The shape only: each value is checked where live samples are (``ToolStats.load_dict``)."""

    model_config = ConfigDict(extra="ignore")

    version: int = Field(1, ge=1, le=1)
    tools: dict[str, list[Any]] = {}  # per tool: durations (seconds)
    global_: list[Any] = Field(default_factory=list, alias="global")
    returns: dict[str, list[Any]] = {}  # per tool: 1 came back, 0 never did


class StatsFile(BaseModel):
    """What ``load_stats`` accepts: the ``tool_stats`` and ``signals`` of ``snapshot()``."""

    model_config = ConfigDict(extra="ignore")

    tool_stats: ToolStatsFile
    signals: dict = {}


def write_stats(snapshot: dict, path: str | os.PathLike) -> None:
    """Write atomically: readers (and a restart after SIGKILL) never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(snapshot, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_stats(path: str | os.PathLike) -> Optional[StatsFile]:
    """The validated file, or None (missing: cold start; unreadable or wrong shape: reported)."""
    path = Path(path)
    if not path.is_file():
        logger.info("continuum: no tool statistics at %s; cold start", path)
        return None
    try:
        return StatsFile.model_validate(orjson.loads(path.read_bytes()))
    except (OSError, ValueError, ValidationError) as exc:  # orjson.JSONDecodeError is a ValueError
        logger.warning("continuum: ignoring unreadable tool statistics %s: %s", path, str(exc)[:500])
        return None


def load_stats(controller, path: str | os.PathLike) -> bool:
    data = read_stats(path)
    if data is None:
        return False
    tool_stats = {
        "version": data.tool_stats.version,
        "tools": data.tool_stats.tools,
        "global": data.tool_stats.global_,
        "returns": data.tool_stats.returns,
    }
    refused = controller.stats.refused
    try:
        controller.load_snapshot(tool_stats, data.signals)
    except (ValueError, TypeError, KeyError) as exc:
        logger.warning("continuum: ignoring tool statistics %s: %s", path, exc)
        return False
    if left_out := controller.stats.refused - refused:
        logger.warning("continuum: %d samples in %s are out of bounds; left out", left_out, path)
    logger.info("continuum: loaded tool statistics from %s", path)
    return True


class StatsSaver:
    """Writes snapshots to ``path`` on a daemon thread. ``submit`` never blocks; ``flush`` waits
    (bounded) for the latest snapshot to be written -- used at shutdown."""

    def __init__(self, path: str | os.PathLike, *, write: Callable[[dict, Path], None] = write_stats) -> None:
        self.path = Path(path)
        self._write = write
        self._cond = threading.Condition()
        self._pending: Optional[dict] = None
        self._busy = False
        self.saved = 0
        self.failures = 0
        self._reported: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="continuum-stats-saver", daemon=True)
        self._thread.start()

    def submit(self, snapshot: dict) -> None:
        with self._cond:
            self._pending = snapshot  # a newer snapshot supersedes one not yet written
            self._cond.notify()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until nothing is pending or being written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout=timeout_s)

    def save_now(self, snapshot: dict) -> bool:
        """Write synchronously on the caller's thread (shutdown paths); never raises."""
        return self._save(snapshot)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                snapshot, self._pending, self._busy = self._pending, None, True
            try:
                self._save(snapshot)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _save(self, snapshot: dict) -> bool:
        try:
            self._write(snapshot, self.path)
        except Exception as exc:  # never let persistence take serving down
            self.failures += 1
            kind = type(exc).__name__
            if kind not in self._reported:  # once per kind: a full disk must not flood the log
                self._reported.add(kind)
                logger.error(
                    "continuum: saving tool statistics to %s failed (%s: %s); serving continues", self.path, kind, exc
                )
            return False
        self.saved += 1
        return True
