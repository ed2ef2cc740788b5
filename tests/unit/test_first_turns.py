"""Whether a request that continued nothing is taken as a program's first turn (``core/first_turns.py``)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.first_turns import FirstTurns


def test_no_evidence_is_no_program():
    first = FirstTurns()
    assert not first.are_programs()
    first.finished("a", 0.0)  # finished, not yet resolved either way
    assert not first.are_programs()


def test_continued_first_turns_make_the_next_one_a_program_until_single_shots_outnumber_them():
    first = FirstTurns(return_s=10.0)
    first.finished("a", 0.0)
    first.continued("a")
    assert first.are_programs()
    for i, t in enumerate((1.0, 2.0)):
        first.finished(f"s{i}", t)
    first.expire(11.5)  # s0 is single-shot; s1 is still within its return time
    assert not first.are_programs()  # one continued, one not: not more continued than not
    first.continued("s1")
    assert first.are_programs()
    first.continued("s1")  # a second continuation of the same id resolves nothing
    first.continued("never-seen")
    first.check_integrity()
    assert first.are_programs()


def test_the_decision_reads_a_window_of_the_latest_outcomes():
    first = FirstTurns(return_s=1.0, window=4)
    for i in range(10):  # an old run of single-shot traffic
        first.finished(f"s{i}", float(i))
    first.expire(100.0)
    assert not first.are_programs()
    for i in range(3):  # agents now: three continued of the latest four outcomes
        first.finished(f"a{i}", 100.0)
        first.continued(f"a{i}")
    assert first.are_programs()
    first.check_integrity()


def test_awaiting_first_turns_are_bounded_and_overflow_counts_as_not_continued():
    first = FirstTurns(return_s=1e9, max_awaiting=3)
    for i in range(5):
        first.finished(f"s{i}", float(i))
    first.check_integrity()
    first.continued("s0")  # pushed out by the bound: resolved already
    first.continued("s4")
    assert not first.are_programs()  # 2 not continued, 1 continued


def test_bad_arguments_are_refused():
    for kwargs in ({"return_s": 0}, {"window": 0}, {"max_awaiting": 0}):
        with pytest.raises(ValueError):
            FirstTurns(**kwargs)


@given(
    st.lists(
        st.tuples(st.sampled_from(["finish", "continue", "expire"]), st.integers(0, 7), st.floats(0, 5)),
        max_size=60,
    )
)
def test_state_stays_consistent_and_bounded(ops):
    first = FirstTurns(return_s=2.0, window=5, max_awaiting=4)
    now = 0.0
    for op, i, dt in ops:
        now += dt
        if op == "finish":
            first.finished(f"p{i}", now)
        elif op == "continue":
            first.continued(f"p{i}")
        else:
            first.expire(now)
        first.check_integrity()
