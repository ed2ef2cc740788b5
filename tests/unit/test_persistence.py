"""Statistics persistence cannot hurt serving: bad files are ignored, failed writes are counted."""

import json
import time

import pytest

from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.persistence import StatsSaver, load_stats, read_stats
from sglang_continuum.core.settings import ContinuumSettings


def controller():
    return ContinuumController(ContinuumSettings(), clock=ManualClock(), budget_tokens=100)


@pytest.mark.parametrize(
    "content",
    [
        '{"tool_stats": []}',
        '{"tool_stats": {"version": 1}, "signals": []}',
        '{"tool_stats": {"version": 2, "tools": {}}}',
        '{"tool_stats": {"version": 1, "tools": {"bash": [-1.0]}}}',
        '{"tool_stats": {"version": 1, "tools": {"bash": "fast"}}}',
        "[1, 2, 3]",
        '{"tool_stats": {"version": 1, "glo',
    ],
)
def test_wrongly_shaped_or_truncated_files_are_ignored(tmp_path, content):
    path = tmp_path / "stats.json"
    path.write_text(content)
    c = controller()
    assert read_stats(path) is None and not load_stats(c, path)
    assert len(c.stats.global_samples) == 0


def test_a_good_file_loads(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(
        json.dumps(
            {
                "tool_stats": {"version": 1, "tools": {"bash": [0.5, 1.0]}, "global": [0.5, 1.0]},
                "signals": {"program_turns": [3, 4]},
            }
        )
    )
    c = controller()
    assert load_stats(c, path)
    assert c.stats.tool("bash").samples() == [0.5, 1.0] and len(c.ttl_model.eta) == 2


def test_failed_saves_are_counted_and_never_raise(tmp_path):
    saver = StatsSaver(tmp_path)  # a directory: every write fails
    saver.submit({"x": 1})
    assert saver.flush(timeout_s=5.0)
    assert saver.failures == 1 and saver.saved == 0
    assert saver.save_now({"x": 2}) is False and saver.failures == 2


def test_saves_happen_off_the_callers_thread_and_keep_the_latest(tmp_path):
    written = []

    def slow_write(snapshot, path):
        time.sleep(0.05)
        written.append(snapshot["n"])

    saver = StatsSaver(tmp_path / "s.json", write=slow_write)
    t0 = time.perf_counter()
    for n in range(20):
        saver.submit({"n": n})
    assert time.perf_counter() - t0 < 0.05  # submit never waits for a write
    assert saver.flush(timeout_s=5.0)
    assert written[-1] == 19 and len(written) < 20  # superseded snapshots are skipped


def test_stats_path_is_checked_at_start(tmp_path):
    with pytest.raises(ValueError, match="stats_path .* is a directory"):
        ContinuumSettings(stats_path=str(tmp_path))
    assert ContinuumSettings(stats_path=str(tmp_path / "new" / "stats.json")).stats_path
