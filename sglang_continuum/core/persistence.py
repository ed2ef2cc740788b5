"""Warm start: tool statistics saved to and loaded from a JSON file.

The paper's agents are post-trained with their tools, so duration statistics exist before
serving. The same file doubles as the endpoint-free dump of the current statistics.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import orjson

logger = logging.getLogger(__name__)


def save_stats(controller, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(controller.snapshot(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # readers never see a half-written file
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_stats(controller, path: str | os.PathLike) -> bool:
    """Load statistics if the file exists; a missing file is a cold start, a corrupt one is
    reported and ignored (serving must not fail because of it)."""
    path = Path(path)
    if not path.is_file():
        logger.info("continuum: no tool statistics at %s; cold start", path)
        return False
    try:
        controller.load_snapshot(orjson.loads(path.read_bytes()))
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("continuum: ignoring unreadable tool statistics %s: %s", path, exc)
        return False
    logger.info("continuum: loaded tool statistics from %s", path)
    return True
