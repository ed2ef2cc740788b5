"""Whether a request that continued nothing is taken as a program's first turn (``core/first_turns.py``)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.first_turns import HORIZON_FACTOR, FirstTurns


def test_no_evidence_is_no_program():
    first = FirstTurns()
    assert not first.are_programs() and first.horizon == first.return_s
    first.finished("a", 0.0)  # finished, not yet resolved either way
    assert not first.are_programs()


def test_a_few_fast_continuations_do_not_outvote_single_shots_still_awaiting_theirs():
    """Issue 59: three agents' first turns are continued within 2 s while ten one-shot requests
    finished among them are never continued. Counted as soon as known, the three continuations
    make first turns programs for a whole RETURN_S (every one-shot in between pinned); counted a
    common horizon after each finished, the one-shots weigh in and the decision never flips."""
    first = FirstTurns()
    for i in range(10):
        first.finished(f"shot{i}", 0.1 * i)
        if i == 4:
            for a in range(3):
                first.finished(f"agent{a}", 0.45)
    for a in range(3):
        first.continued(f"agent{a}", 2.45)
    single = []
    for now in (2.45, 3.0, 4.0, 4.44, 4.45, 4.5, 5.0, 10.0, 30.0, 59.0, 61.0):
        single += first.expire(now)
        assert not first.are_programs(), now
        first.check_integrity()
    assert first.horizon == pytest.approx(HORIZON_FACTOR * 2.0)
    assert sorted(single) == sorted(f"shot{i}" for i in range(10))  # resolved within the horizon, not at 60 s


def test_single_shots_that_finished_after_the_agents_count_a_horizon_after_them():
    """Outcomes count in the order first turns finished: one-shots that finished after the agents
    can be outvoted only for as long as they finished after them, and those taken as programs
    meanwhile are named as single-shot a horizon after they finished (their pins go then)."""
    first = FirstTurns(min_horizon_s=0.0)
    first.finished("agent", 0.0)
    first.continued("agent", 1.0)  # horizon 2 s
    for i in range(2):
        first.finished(f"shot{i}", 0.5)
    assert first.expire(2.0) == [] and first.are_programs()  # the agent, a horizon old
    first.finished("taken", 2.1)  # (taken as a program: the caller asked at 2.1)
    assert first.expire(2.5) == ["shot0", "shot1"] and not first.are_programs()
    assert first.expire(4.2) == ["taken"]


def test_agents_alone_make_first_turns_programs_once_their_cohort_is_a_horizon_old():
    first = FirstTurns()
    for i in range(3):
        first.finished(f"agent{i}", 0.0)
        first.continued(f"agent{i}", 1.5)
    assert first.expire(2.9) == [] and not first.are_programs()  # not a horizon (3 s) old yet
    assert first.expire(3.0) == [] and first.are_programs()
    first.check_integrity()


def test_the_horizon_follows_continuation_delays_within_its_bounds():
    first = FirstTurns(return_s=10.0, min_horizon_s=1.0)
    first.finished("fast", 0.0)
    first.continued("fast", 0.1)
    assert first.horizon == 1.0  # at least min_horizon_s
    first.finished("slow", 0.0)
    first.continued("slow", 4.0)
    first.continued("slow", 9.0)  # a second continuation of the same id is not a delay
    assert first.horizon == pytest.approx(HORIZON_FACTOR * 4.0)
    first.finished("slower", 0.0)
    first.continued("slower", 9.0)
    assert first.horizon == 10.0  # at most return_s


def test_a_late_continuation_counts_as_not_continued_but_lengthens_the_horizon():
    """An agent slower than the horizon errs towards FCFS for its own first turn, and teaches
    the horizon its delay: the next slow agents are read right."""
    first = FirstTurns(min_horizon_s=0.0)
    first.finished("fast", 0.0)
    first.continued("fast", 1.0)  # horizon 2 s
    first.finished("slow", 0.0)
    assert first.expire(2.0) == ["slow"]
    first.continued("slow", 5.0)  # too late to count, not too late to learn from
    assert first.horizon == pytest.approx(HORIZON_FACTOR * 5.0)
    first.finished("gone", 10.0)
    first.expire(10.0 + first.return_s + 1)
    first.continued("gone", 10.0 + first.return_s + 2)  # past return_s: not watched any more
    assert first.horizon == pytest.approx(HORIZON_FACTOR * 5.0)
    first.check_integrity()


def test_the_decision_reads_a_window_of_the_latest_outcomes():
    first = FirstTurns(return_s=1.0, window=4)
    for i in range(10):  # an old run of single-shot traffic
        first.finished(f"s{i}", float(i))
    first.expire(100.0)
    assert not first.are_programs()
    for i in range(3):  # agents now: three continued of the latest four outcomes
        first.finished(f"a{i}", 100.0)
        first.continued(f"a{i}", 100.5)
    first.expire(102.0)
    assert first.are_programs()
    first.check_integrity()


def test_awaiting_first_turns_are_bounded_and_overflow_resolves_the_oldest():
    first = FirstTurns(return_s=1e9, max_awaiting=3)
    first.finished("s0", 0.0)
    first.continued("s0", 0.5)
    for i in range(1, 5):
        first.finished(f"s{i}", float(i))
    first.check_integrity()
    first.continued("s1", 5.0)  # pushed out by the bound: resolved already (a late delay only)
    first.continued("s4", 5.0)
    assert not first.are_programs()  # s0 continued, s1 not


def test_bad_arguments_are_refused():
    for kwargs in ({"return_s": 0}, {"window": 0}, {"max_awaiting": 0}, {"min_horizon_s": -1}):
        with pytest.raises(ValueError):
            FirstTurns(**kwargs)


@given(
    st.lists(
        st.tuples(st.sampled_from(["finish", "continue", "expire"]), st.integers(0, 7), st.floats(0, 5)),
        max_size=60,
    )
)
def test_state_stays_consistent_and_bounded(ops):
    first = FirstTurns(return_s=8.0, window=5, max_awaiting=4)
    now = 0.0
    for op, i, dt in ops:
        now += dt
        if op == "finish":
            first.finished(f"p{i}", now)
        elif op == "continue":
            first.continued(f"p{i}", now)
        else:
            first.expire(now)
        first.check_integrity()
