"""Program-level admission control (core/admission_control.py): the thrash signal (core/return_loss.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.return_loss import ReturnLossMeter
from sglang_continuum.core.settings import ContinuumSettings


def test_ratio_is_the_lost_share_of_previous_contexts_over_the_window():
    m = ReturnLossMeter(window=8, threshold=0.5, min_samples=2)
    m.observe(1000, 1000)  # everything still cached
    assert m.ratio == 0.0 and not m.thrashing
    m.observe(1000, 0)  # all of it re-prefilled
    assert m.ratio == 0.5 and not m.thrashing  # not above the threshold
    m.observe(2000, 200)  # 1800 lost
    assert m.ratio == pytest.approx(2800 / 4000) and m.thrashing
    for _ in range(8):  # the window slides: eight full hits push the losses out
        m.observe(1000, 1500)  # a longer cached prompt than the previous context loses nothing
    assert m.ratio == 0.0 and not m.thrashing
    m.check_integrity()


def test_too_few_returns_are_no_signal_and_a_flush_forgets_them():
    m = ReturnLossMeter(window=32, threshold=0.5, min_samples=8)
    for _ in range(7):
        m.observe(500, 0)
    assert m.ratio == 1.0 and not m.thrashing
    m.observe(500, 0)
    assert m.thrashing
    m.reset()
    assert m.ratio == 0.0 and not m.thrashing
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
    clock = ManualClock()
    return ContinuumController(ContinuumSettings(ttl_model="fixed", **kw), clock=clock, budget_tokens=10_000), clock


def meta(pid):
    return ProgramMeta(pid, tool_name="bash")


def thrash(c, programs=("a", "b"), turns=4):
    """Programs in flight come back and find their contexts gone (nothing cached)."""
    for pid in programs:
        c.turn_admitted(c.turn_arrived(meta(pid)), 100, cached_tokens=0)
        c.turn_finished(meta(pid), context_tokens=100, handle=f"lock-{pid}")  # pinned: in the working set
    for _ in range(turns):
        for pid in programs:
            c.turn_admitted(c.turn_arrived(meta(pid)), 200, cached_tokens=0)
            c.turn_finished(meta(pid), context_tokens=200, handle=f"lock-{pid}")


def test_a_thrashing_pool_holds_new_programs_although_current_working_sets_fit():
    c, clock = make(return_loss_threshold=0.5, max_overtakes=0)
    thrash(c)
    assert c.admission_control.thrashing
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 100, 10_000, clock())  # 500 tokens in flight in a 10k pool: held all the same
    assert c.admission.held_back == 1 and c.admission.held_back_thrashing == 1
    c.check_integrity()


def test_the_signal_is_off_by_default_and_returns_that_hit_clear_it():
    c, clock = make(max_overtakes=0)
    thrash(c)
    assert not c.holds_back(c.turn_arrived(meta("new")), 100, 10_000, clock())  # measured, not acted on
    assert c.admission_control.return_loss.ratio > 0.5
    c, clock = make(return_loss_threshold=0.5, max_overtakes=0)
    thrash(c)
    for _ in range(16):  # the programs come back to full hits
        for pid in ("a", "b"):
            c.turn_admitted(c.turn_arrived(meta(pid)), 200, cached_tokens=200)
            c.turn_finished(meta(pid), context_tokens=200, handle=f"lock-{pid}")
    assert not c.admission_control.thrashing
    assert not c.holds_back(c.turn_arrived(meta("new")), 100, 10_000, clock())


def test_an_overdue_newcomer_still_passes_a_thrashing_pool_within_the_overcommit_limit():
    c, clock = make(return_loss_threshold=0.5, max_overtakes=1)
    thrash(c)
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 100, 10_000, clock())
    c.turn_admitted(c.turn_arrived(meta("a")), 200, cached_tokens=200)  # a later arrival overtakes it
    assert not c.holds_back(newcomer, 100, 10_000, clock()) and newcomer.bypassed


def test_load_control_suspends_returning_turns_of_programs_ranked_after_a_full_pool():
    c, clock = make(return_loss_threshold=0.5, load_control=True, max_overtakes=0)
    thrash(c, programs=("a", "b", "c"))  # three programs in flight, 200 tokens each, losing their contexts
    a, b, late = (c.turn_arrived(meta(pid)) for pid in ("a", "b", "c"))
    assert not c.holds_back(a, 200, 350, clock())  # nothing ranked before "a"
    assert not c.holds_back(b, 100, 350, clock())  # "a"'s 200 + 100 fit a 350-token pool
    assert c.holds_back(late, 200, 350, clock())  # "a" and "b" fill it: "c" waits for them
    assert c.holds_back(late, 200, 350, clock()) and c.admission.suspended == 1  # counted once per request
    assert c.admission.held_back == 0  # no first turn was held
    c.check_integrity()


def test_load_control_needs_the_thrash_signal_and_yields_to_bounded_waiting():
    c, clock = make(return_loss_threshold=0.5, max_overtakes=0)  # load control off (the default)
    thrash(c, programs=("a", "b", "c"))
    assert not c.holds_back(c.turn_arrived(meta("c")), 200, 350, clock())
    c, clock = make(load_control=True, max_overtakes=0)  # on, but no thrash signal (threshold 0)
    thrash(c, programs=("a", "b", "c"))
    assert not c.holds_back(c.turn_arrived(meta("c")), 200, 350, clock())
    c, clock = make(return_loss_threshold=0.5, load_control=True, max_overtakes=1)
    thrash(c, programs=("a", "b", "c"))
    late = c.turn_arrived(meta("c"))
    assert c.holds_back(late, 200, 350, clock())
    c.turn_admitted(c.turn_arrived(meta("a")), 200, cached_tokens=0)  # a later arrival overtakes it
    assert not c.holds_back(late, 200, 350, clock())  # overdue: it passes


@pytest.mark.parametrize("limit", [0.0, 1.5])
def test_an_idle_engine_admits_a_newcomer_unless_past_the_idle_overcommit(limit):
    # 800 tokens in flight in a 1000-token pool: a 300-token newcomer is held while others run;
    # with the engine idle it passes by default (work-conserving), and with a limit only within it
    c, clock = make(idle_admission_overcommit=limit, max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    small, big = c.turn_arrived(meta("small")), c.turn_arrived(meta("big"))
    assert c.holds_back(small, 300, 1000, clock()) and c.holds_back(big, 800, 1000, clock())
    assert not c.holds_back(small, 300, 1000, clock(), idle=True)  # 1100 <= 1.5 pools
    assert c.holds_back(big, 800, 1000, clock(), idle=True) is (limit > 0)  # 1600 > 1.5 pools
    returning = c.turn_arrived(meta("a"))
    assert not c.holds_back(returning, 900, 1000, clock(), idle=True)  # a later turn is never held
