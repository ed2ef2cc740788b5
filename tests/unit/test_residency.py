"""Residency (core/residency.py): every hold bounded, every hold and release priced by one model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.priority import DUE, NEW
from sglang_continuum.core.residency import FIRST_TURN, PAUSE, Holds, Residency
from sglang_continuum.core.return_loss import RELEASE_LOSS_HORIZON_S, ReleaseLossMeter
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.turns import TurnTag
from tests.support import controller


def meta(pid):
    return ProgramMeta(pid, tool_name="bash")


def _stats(*seconds: float) -> ToolStats:
    stats = ToolStats()
    for s in seconds:
        stats.record("bash", s)
    return stats


def _nobody_waits(pid: str) -> bool:
    return False


# -- H1: the bound on every hold -----------------------------------------------------------
def test_a_held_first_turn_is_let_go_at_its_bound_and_goes_next():
    """800 tokens run in a 1000-token pool: a 300-token newcomer is held. With ``max_hold_s`` 10 it
    comes due 10 s after it arrived: re-keyed ahead of every other turn, no longer held, its hold
    reported when it is admitted. Without a bound (0) it is held as long as the working set fills
    the pool."""
    for bound, due in ((10.0, True), (0.0, False)):
        c, clock = controller(max_overtakes=0, max_hold_s=bound, rebuild_s=2.0)
        c.turn_admitted(c.turn_arrived(meta("a")), 800)
        newcomer = c.turn_arrived(meta("new"))
        assert c.holds_back(newcomer, 300, 1000)
        assert c.priority_key(newcomer, False)[0] == NEW
        clock.advance(9.9)
        c.step(_nobody_waits, 1000)
        assert c.holds_back(newcomer, 300, 1000) and not c.rekeyed
        clock.advance(0.1)
        c.step(_nobody_waits, 1000)
        assert c.residency.holds.longest(clock()) == pytest.approx(10.0)
        assert (not c.holds_back(newcomer, 300, 1000)) is due, bound
        assert (c.rekeyed == {"new"}) is due
        assert (c.priority_key(newcomer, False)[0] == DUE) is due
        c.turn_admitted(newcomer, 300)
        assert c.residency.holds.longest(clock()) == 0.0
        assert list(c.residency.holds.ended) == [(FIRST_TURN, pytest.approx(10.0))]
        c.check_integrity()


def test_a_turn_past_its_bound_may_shed_any_resident_pin_and_that_program_leaves_the_working_set():
    """The pins a blocked turn may shed are those of programs ranked after it, unless its hold bound
    passed: then any resident program's (latest first), which leaves the working set (its room
    is the due turn's now; its own return takes its turn)."""
    c, clock = controller(fixed_ttl_s=20.0, max_overtakes=0, max_hold_s=10.0)
    a = c.turn_arrived(meta("a"))
    c.turn_admitted(a, 800)
    newcomer = c.turn_arrived(meta("new"))  # ranked after a
    assert c.holds_back(newcomer, 300, 1000)
    assert c.turn_finished(meta("a"), context_tokens=800, handle=object(), tag=a).pin is not None
    assert "a" in c.door.working_set
    assert c.shed("admission", ranked_after=newcomer.program_rank, keep="new") is None  # a is ranked first
    clock.advance(10.0)
    c.step(_nobody_waits, 1000)
    assert newcomer.due
    pin = c.shed("hold_bound", keep="new")
    assert pin is not None and pin.program_id == "a"
    assert "a" not in c.door.working_set and c.sheds.hold_bound == 1
    assert not c.holds_back(newcomer, 300, 1000)
    c.check_integrity()


def test_a_held_turn_that_is_aborted_leaves_the_longest_hold():
    c, clock = controller(max_overtakes=0, max_hold_s=60.0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 300, 1000)
    clock.advance(5.0)
    assert c.residency.holds.longest(clock()) == 5.0
    c.turn_aborted(meta("new"), newcomer)
    assert c.residency.holds.longest(clock()) == 0.0 and not c.residency.holds.ended  # not admitted
    c.check_integrity()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["hold", "leave", "admit", "tick"]), st.integers(0, 7)), max_size=80))
def test_holds_stay_consistent_whatever_the_order_of_events(events):
    """Every held turn comes due once, at or after its time; the longest hold is a held turn's."""
    holds, now = Holds(), 0.0
    tags = [TurnTag(meta(f"p{i}"), i, i, 0.0) for i in range(8)]
    for kind, i in events:
        tag = tags[i]
        if kind == "hold" and not tag.held_back and not tag.hold_ended:
            tag.queued_at = now
            holds.held(tag, now + 3.0)
            tag.held_back = True
        elif kind in ("leave", "admit"):
            holds.left(tag, now, admitted=kind == "admit")
        elif kind == "tick":
            now += 1.0
            for due in holds.due(now):
                assert due.due_at <= now and due.held_back and not due.hold_ended
        live = [t for t in tags if t.held_back and not t.hold_ended]
        assert holds.longest(now) == (max(now - t.queued_at for t in live) if live else 0.0)
        holds.check_integrity()
    assert holds.came_due == sum(t.due for t in tags)


# -- M1: the resident hold is the pin it will get ------------------------------------------
def test_the_resident_hold_is_priced_at_the_capped_pin_and_the_chance_of_a_return_within_it():
    """A tool of p90 66 s, pins capped at 30 s. Priced at 66 s (a rebuild worth 50 s of a batch
    place) keeping would not pay; the pin really lasts 30 s, and 80% of programs are back within it:
    0.8 x 50 >= 30, kept for 30 s. A tool whose programs are never back within 30 s is never kept,
    whatever the rebuild: its pin would end before every return."""
    quick = _stats(*([10.0] * 8), 66.0, 66.0)  # 80% within 10 s, p90 66 s
    r = Residency(True, quick, rebuild_s=lambda tokens: 50.0, max_ttl_s=30.0)
    r.binding_until = 10.0
    assert r.resident_ttl("bash", now=1.0, context_tokens=100) == 30.0
    slow = _stats(*([40.0] * 8), 66.0, 66.0)
    r = Residency(True, slow, rebuild_s=lambda tokens: 1e6, max_ttl_s=30.0)
    r.binding_until = 10.0
    assert r.resident_ttl("bash", now=1.0, context_tokens=100) == 0.0


# -- M2: the working set keeps a program while its pin holds its room -----------------------
def test_a_pinned_program_stays_in_the_working_set_while_its_pin_outlasts_the_window():
    c, clock = controller(fixed_ttl_s=100.0, max_ttl_s=120.0, max_overtakes=0)
    a = c.turn_arrived(meta("a"))
    c.turn_admitted(a, 800)
    assert c.turn_finished(meta("a"), context_tokens=800, handle=object(), tag=a).pin is not None
    clock.advance(31.0)  # past the 30 s window, within the pin
    c.step(_nobody_waits, 1000)
    assert "a" in c.door.working_set
    assert c.holds_back(c.turn_arrived(meta("new")), 300, 1000)  # its room is the pin's
    clock.advance(70.0)  # the pin ends: the room goes with it
    c.step(_nobody_waits, 1000)
    assert "a" not in c.door.working_set
    c.check_integrity()


# -- M3: growth priced on the pin it will get ----------------------------------------------
def test_room_for_growth_is_priced_at_the_pin_it_would_get_and_a_release_priced_as_lost():
    """Rebuilding the expected final context (900 tokens) costs 12 s against tools of p90 5 s:
    reserved, and still reserved once releases are seen to lose only a tenth (priced by the
    release loss, the room was given away whenever releases had been cheap lately); with tools of
    p90 60 s and pins capped at 30 s the hold priced is 30 s, and 12 s of rebuild is not worth it."""
    from sglang_continuum.core.programs import ProgramState

    for tools, reserved in (([1.0, 2.0, 3.0, 4.0, 5.0] * 2, True), ([60.0] * 10, False)):
        r = Residency(True, _stats(*tools), rebuild_s=lambda tokens: tokens / 75, max_ttl_s=30.0)
        ended = ProgramState("ended", arrival_rank=1, last_seen=0.0, turns_arrived=2, turns_finished=2)
        ended.context_tokens = 900
        r.working_set.forgotten(ended)
        for _ in range(8):
            r.let_go_returned(900, 810, now=0.0)
        r.step(0.0, 900)  # K = 1
        assert r.working_set.reserve_growth is reserved, tools


# -- M4: the release-loss meter keeps learning ----------------------------------------------
def test_the_release_loss_forgets_releases_past_its_horizon():
    """Releases seen to lose half their contexts (a quiet pool keeps unpinned contexts) price a
    release at 0.5; once none has been seen for the horizon (residency keeps them all, or the pool
    filled since) that says nothing of the pool now, and a release is priced as lost again, which
    is what a binding door makes of it."""
    m = ReleaseLossMeter()
    assert m.ratio == 1.0 and not m.ready
    for _ in range(8):
        m.observe(1000, 500, now=0.0)
    assert m.ratio == 0.5
    m.expire(RELEASE_LOSS_HORIZON_S - 1.0)
    assert m.ratio == 0.5
    m.expire(RELEASE_LOSS_HORIZON_S + 1.0)
    assert m.ratio == 1.0 and m.observed == 8
    m.check_integrity()


# -- M8: pausing priced -----------------------------------------------------------------------
def test_a_return_is_paused_only_where_what_it_lost_is_dear():
    """A return that found its 500-token context gone, its program out of the working set, in a
    pool the others fill. On an engine where rebuilding it costs 10 s against tools of p90 1 s it
    waits; where it costs 0.1 s it re-prefills at once (no growth reserved: a lost context is
    cheap), and so does one that lost only 5 tokens."""
    for rebuild_s, lost, paused in ((10.0, 500, True), (0.1, 500, False), (10.0, 5, False)):
        c, clock = controller(fixed_ttl_s=0.0, max_overtakes=0, rebuild_s=rebuild_s)
        for _ in range(8):
            c.stats.record("bash", 1.0)
        a = c.turn_arrived(meta("a"))
        c.turn_admitted(a, 500)
        c.turn_finished(meta("a"), context_tokens=500, handle=object(), tag=a)  # no pin: a leaves
        for pid in ("x", "y"):  # two programs that ended at 500 tokens: the expected final context
            t = c.turn_arrived(ProgramMeta(pid, is_last_step=True))
            c.turn_admitted(t, 500)
            c.turn_finished(ProgramMeta(pid, is_last_step=True), context_tokens=500, handle=None, tag=t)
        c.turn_admitted(c.turn_arrived(meta("b")), 600)
        c.step(_nobody_waits, 1000)
        back = c.turn_arrived(meta("a"), prompt_tokens=700, cached_tokens=lambda lost=lost: 500 - lost)
        assert back.lost_tokens == lost
        if lost == 5:  # 99% found: no context gone, never paused
            assert not back.context_gone
        assert c.holds_back(back, 700, 1000) is paused, (rebuild_s, lost)
        c.check_integrity()


# -- L6: the door's query is a pure read ----------------------------------------------------
def test_the_doors_query_changes_nothing_it_prices():
    c, _ = controller(max_overtakes=0, rebuild_s=0.1)
    for _ in range(8):
        c.stats.record("bash", 5.0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    c.step(_nobody_waits, 1000)
    r = c.residency
    before = (r.capacity_tokens, c.door.working_set.reserve_growth, r._growth_priced_at)
    c.holds_back(c.turn_arrived(meta("new")), 300, 5000)  # another capacity: not read into the price
    assert (r.capacity_tokens, c.door.working_set.reserve_growth, r._growth_priced_at) == before


def test_a_paused_returns_hold_is_reported_as_a_pause():
    c, clock = controller(fixed_ttl_s=0.0, max_overtakes=0, max_hold_s=30.0)
    a = c.turn_arrived(meta("a"))
    c.turn_admitted(a, 500)
    c.turn_finished(meta("a"), context_tokens=500, handle=object(), tag=a)
    c.turn_admitted(c.turn_arrived(meta("b")), 600)
    back = c.turn_arrived(meta("a"), prompt_tokens=700, cached_tokens=lambda: 0)
    assert c.holds_back(back, 700, 1000)
    clock.advance(4.0)
    c.turn_admitted(back, 700)
    assert list(c.residency.holds.ended) == [(PAUSE, 4.0)]


def test_a_program_released_for_a_turn_past_its_bound_waits_its_own_turn_on_return():
    """Released to make room for a due turn, a program that comes back to its context still
    cached is held all the same while the pool is full (back in at once, it would take the room
    of the turn it was released for), and is let go at its own bound like any held turn."""
    c, clock = controller(fixed_ttl_s=20.0, max_overtakes=0, max_hold_s=10.0)
    a = c.turn_arrived(meta("a"))
    c.turn_admitted(a, 600)
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 500, 1000)
    c.turn_finished(meta("a"), context_tokens=600, handle=object(), tag=a)
    clock.advance(10.0)
    c.step(_nobody_waits, 1000)
    assert c.shed("hold_bound", keep="new").program_id == "a"
    c.turn_admitted(newcomer, 500)
    back = c.turn_arrived(meta("a"), prompt_tokens=700, cached_tokens=lambda: 600)  # found all of it
    assert not back.context_gone and c.holds_back(back, 700, 1000)
    clock.advance(10.0)
    c.step(_nobody_waits, 1000)
    assert back.due and not c.holds_back(back, 700, 1000)
    c.check_integrity()


def test_the_door_binds_while_a_turn_it_held_still_waits_or_the_admitted_programs_overfill_the_pool():
    """Binding is what prices residency: while a turn the door held still waits (due or not), or the
    programs admitted overfill the pool (turns let in at their bound), the room a program lets go
    is someone else's at once. It used to end 5 s after the last hold, however long the turn held
    went on waiting."""
    c, clock = controller(max_overtakes=0, max_hold_s=100.0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 300, 1000)
    clock.advance(30.0)
    c.step(_nobody_waits, 1000)
    assert c.residency.binding(clock())  # held 30 s ago, still waiting
    c.turn_aborted(meta("new"), newcomer)
    clock.advance(30.0)
    c.step(_nobody_waits, 1000)
    assert not c.residency.binding(clock())
    c.turn_admitted(c.turn_arrived(meta("b")), 400)  # 1,200 tokens admitted in a 1,000-token pool
    c.step(_nobody_waits, 1000)
    assert c.residency.binding(clock())
    c.check_integrity()


def test_the_holds_stay_bounded_behind_a_turn_held_for_long():
    holds = Holds()
    first = TurnTag(meta("first"), 0, 0, 0.0)
    holds.held(first, None)
    first.held_back = True
    for i in range(1, 1000):
        tag = TurnTag(meta(f"p{i}"), i, i, float(i))
        tag.queued_at = float(i)
        holds.held(tag, None)
        tag.held_back = True
        holds.left(tag, float(i), admitted=True)
    assert len(holds._by_start) <= 2 * holds.waiting + 65 and holds.longest(1000.0) == 1000.0
    holds.check_integrity()
