"""The door (core/door.py: program-level admission control) and the thrash signal (core/return_loss.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.return_loss import ReturnLossMeter
from tests.support import controller


def test_ratio_is_the_lost_share_of_previous_contexts_over_the_window():
    m = ReturnLossMeter(window=8, min_samples=2)
    m.observe(1000, 1000)  # everything still cached
    assert m.ratio == 0.0
    m.observe(1000, 0)  # all of it re-prefilled
    assert m.ratio == 0.5
    m.observe(2000, 200)  # 1800 lost
    assert m.ratio == pytest.approx(2800 / 4000)
    for _ in range(8):  # the window slides: eight full hits push the losses out
        m.observe(1000, 1500)  # a longer cached prompt than the previous context loses nothing
    assert m.ratio == 0.0
    m.check_integrity()


def test_too_few_returns_are_no_signal_and_a_flush_forgets_them():
    m = ReturnLossMeter(window=32, min_samples=8)
    for _ in range(7):
        m.observe(500, 0)
    assert m.ratio == 1.0 and not m.ready
    m.observe(500, 0)
    assert m.ready
    m.reset()
    assert m.ratio == 0.0 and not m.ready
    m.observe(0, 0)  # a program with no previous context is no sample
    assert m.observed == 8


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-5, 12_000)), max_size=200), st.integers(8, 40))
def test_window_sums_stay_exact(samples, window):
    m = ReturnLossMeter(window=window)
    for previous, cached in samples:
        m.observe(previous, cached)
        m.check_integrity()
        assert 0.0 <= m.ratio <= 1.0


def make(**kw):
    return controller(**kw)


def meta(pid):
    return ProgramMeta(pid, tool_name="bash")


def test_a_first_turn_waits_while_the_working_sets_fill_the_pool():
    c, _ = make(max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 300, 1000) and c.admission.held_back == 1
    assert c.holds_back(newcomer, 300, 1000) and c.admission.held_back == 1  # counted once per request
    assert not c.holds_back(newcomer, 200, 1000)  # fits exactly
    c.check_integrity()


def test_admission_control_off_holds_nothing():
    c, _ = make(admission_control=False, max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    assert not c.holds_back(c.turn_arrived(meta("new")), 900, 1000)
    assert c.admission_reservation(c.turn_arrived(meta("other")), 900) == 0


def test_an_idle_engine_admits_a_newcomer():
    # 800 tokens in flight in a 1000-token pool: a 300-token newcomer is held while others run;
    # with the engine idle it passes (work-conserving)
    c, _ = make(max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    small = c.turn_arrived(meta("small"))
    assert c.holds_back(small, 300, 1000)
    assert not c.holds_back(small, 300, 1000, idle=True)
    returning = c.turn_arrived(meta("a"))
    assert not c.holds_back(returning, 900, 1000)  # a later turn is never held
