"""Statistics persistence cannot hurt serving: bad files are ignored, failed writes are counted."""

import json
import time

import pytest

from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.persistence import StatsSaver, load_stats, read_stats
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_stats import MAX_DURATION_S, ToolStats


def controller():
    return ContinuumController(ContinuumSettings(), clock=ManualClock(), budget_tokens=100)


@pytest.mark.parametrize(
    "content",
    [
        '{"tool_stats": []}',
        '{"tool_stats": {"version": 1}, "signals": []}',
        '{"tool_stats": {"version": 2, "tools": {}}}',
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


def test_out_of_bounds_entries_are_left_out_counted_and_the_rest_loads(tmp_path):
    path = tmp_path / "stats.json"
    tools = {
        "bash": [0.5, -1.0, 1e308, "fast", True, None, 2.0],
        "bad\u202ename": [1.0],  # a bidi override: no client could send this name
        " ": [1.0],
        "x" * 129: [1.0],
    }
    returns = {"bash": [1, 0, 2, -1, 0.5], "\x00": [1]}
    stats = {"version": 1, "tools": tools, "global": [0.5, float("1e308"), 2.0], "returns": returns}
    path.write_text(json.dumps({"tool_stats": stats}))
    c = controller()
    assert load_stats(c, path)
    assert c.stats.tool("bash").samples() == [0.5, 2.0] and c.stats.global_samples.samples() == [0.5, 2.0]
    assert list(c.stats.tools()) == ["bash"] and c.stats.return_probability("bash") == (1 + 1) / (2 + 1)
    assert c.stats.refused == 5 + 3 + 1 + 3 + 1
    c.stats.check_integrity()
    assert c.stats.global_samples.mean == 1.25  # nothing poisoned the sums


def test_a_file_with_more_tools_than_the_bound_keeps_the_most_recent(tmp_path):
    path = tmp_path / "stats.json"
    n = ToolStats().max_tools + 10
    tools = {f"tool{i}": [float(i % 7)] for i in range(n)}
    returns = {f"tool{i}": [1] for i in range(n)}
    path.write_text(json.dumps({"tool_stats": {"version": 1, "tools": tools, "returns": returns}}))
    c = controller()
    assert load_stats(c, path)
    kept = list(c.stats.tools())
    assert len(kept) == c.stats.max_tools and kept == [f"tool{i}" for i in range(10, n)]
    c.stats.check_integrity()


def test_what_a_controller_saves_loads_back_whole(tmp_path):
    c = controller()
    for i in range(20):
        c.stats.record(f"t{i % 3}", 0.1 * i)
        c.stats.record_outcome(f"t{i % 3}", returned=i % 4 != 0)
    c.stats.record("t0", MAX_DURATION_S)  # the bound itself is a valid duration
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"tool_stats": c.stats.to_dict()}))
    again = controller()
    assert load_stats(again, path) and again.stats.refused == 0
    assert again.stats.to_dict() == c.stats.to_dict()


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
