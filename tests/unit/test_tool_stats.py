"""Tool statistics stay bounded and exact whatever they are fed: a sample out of bounds (a peer's,
a stats file's) is refused and counted, never raised and never in a sum; the sorted window the
TTL model reads is exactly the sorted samples after every add."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.tool_stats import (
    DURATION,
    MAX_DURATION_S,
    OUTCOME,
    UNKNOWN_TOOL,
    SampleWindow,
    ToolStats,
    valid_sample,
    valid_tool,
)

ABSURD = [1e308, math.inf, -math.inf, math.nan, -1.0, MAX_DURATION_S * 1.001]


def test_an_absurd_duration_is_refused_and_never_poisons_the_sums():
    stats = ToolStats()
    stats.merge([(DURATION, "bash", x) for x in ABSURD] + [(DURATION, "bash", 2.0), (OUTCOME, "bash", math.nan)])
    for x in ABSURD:
        stats.record("bash", x)  # a local one too: refused, not raised into the scheduler loop
    assert stats.refused == 2 * len(ABSURD) + 1
    assert stats.tool("bash").samples() == [2.0] and stats.global_samples.mean == 2.0
    assert stats.return_probability("bash") == 1.0  # the NaN outcome was not read as "never came back"
    stats.check_integrity()


def test_a_tool_name_no_client_could_send_is_refused():
    stats = ToolStats()
    for name in ("bidi\u202e", "nul\x00", "\t", "x" * 129, "\ud800"):
        stats.merge([(DURATION, name, 1.0), (OUTCOME, name, 1.0)])
    assert stats.tools() == {} and stats.refused == 10 and len(stats.global_samples) == 0
    stats.check_integrity()


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0, MAX_DURATION_S),
    st.integers(-5, 5),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
names = st.one_of(st.sampled_from(["bash", "grep", "unknown"]), st.text(max_size=140))
samples = st.lists(st.tuples(st.sampled_from([DURATION, OUTCOME]), names, values), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(samples, max_size=6))
def test_whatever_peers_send_the_statistics_stay_bounded_and_finite(batches):
    stats = ToolStats(window=8, global_window=16, max_tools=4, return_window=4)
    accepted = 0
    for batch in batches:
        stats.merge(batch)
        accepted += sum(valid_sample(kind, tool or UNKNOWN_TOOL, value) for kind, tool, value in batch)
        stats.check_integrity()
    assert stats.refused == sum(len(b) for b in batches) - accepted
    assert math.isfinite(stats.global_samples.variance)
    assert all(valid_tool(t) for t in stats.tools())
    again = ToolStats(window=8, global_window=16, max_tools=4, return_window=4)
    again.load_dict(stats.to_dict())  # what is saved loads back through the same bounds, all of it
    assert again.refused == 0 and again.to_dict() == stats.to_dict()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.5, 7.0, MAX_DURATION_S]), max_size=60))
def test_the_sorted_window_is_exactly_the_sorted_samples_after_every_add(capacity, xs):
    """The sorted array is kept in place (only the samples between the old and the new one's
    places move); it must equal a fresh sort of the window every time, duplicates included."""
    w = SampleWindow(capacity)
    for x in xs:
        w.add(x)
        assert w.sorted.tolist() == sorted(w.samples())
        w.check_integrity()
    with pytest.raises(ValueError):
        w.sorted[0:1] = 1.0  # read-only for callers
