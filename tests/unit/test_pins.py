import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.pins import Pin, PinTable


def pin(pid, tokens=10, deadline=1.0, arrival=0):
    return Pin(program_id=pid, tokens=tokens, deadline=deadline, arrival_rank=arrival, created=0.0)


def test_add_pop_and_token_accounting():
    t = PinTable(100)
    assert t.add(pin("a", 30)) == (True, [])
    assert t.add(pin("b", 20, arrival=1)) == (True, [])
    assert t.pinned_tokens == 50 and len(t) == 2
    got = t.pop("a")
    assert got.program_id == "a" and t.pinned_tokens == 20 and "a" not in t
    assert t.pop("a") is None
    t.check_integrity()


def test_repinning_a_program_returns_the_old_pin():
    t = PinTable(100)
    old = pin("a", 30)
    t.add(old)
    assert t.add(pin("a", 40)) == (True, [old]) and t.pinned_tokens == 40
    t.check_integrity()


def test_expiry_by_deadline_in_order():
    t = PinTable(1000)
    for i, d in enumerate([3.0, 1.0, 2.0]):
        t.add(pin(f"p{i}", deadline=d))
    assert [p.program_id for p in t.pop_expired(2.0, lambda p: None)] == ["p1", "p2"]
    assert t.next_deadline() == 3.0
    assert t.pop_expired(2.5, lambda p: None) == []
    t.check_integrity()


def test_expired_pin_held_once_while_program_waits():
    t = PinTable(1000)
    t.add(pin("a", deadline=1.0))
    asked = []

    def hold(p):
        asked.append(p.program_id)
        return p.deadline + 5.0

    assert t.pop_expired(1.5, hold) == [] and "a" in t
    assert t.pop_expired(5.9, hold) == []
    assert [p.program_id for p in t.pop_expired(6.0, hold)] == ["a"]
    assert asked == ["a"]  # the hold is granted once: a waiting turn cannot keep a pin forever


def test_budget_sheds_latest_program_arrival_first():
    t = PinTable(50)
    t.add(pin("early", 20, arrival=1))
    t.add(pin("late", 20, arrival=5))
    stored, released = t.add(pin("middle", 20, arrival=3))
    assert stored and [p.program_id for p in released] == ["late"]
    assert {p.program_id for p in t} == {"early", "middle"}
    t.check_integrity()


def test_resident_pins_may_fill_the_ceiling_and_other_pins_keep_to_the_budget():
    """The door keeps resident programs' room: their pins fill up to the ceiling (90), past the
    budget (50) the TTL model's pins keep to; a later program's ordinary pin then finds the budget
    full and sheds nobody resident before it, and the first resident pin's own kind still sheds
    later programs' pins at the ceiling."""
    t = PinTable(50, ceiling_tokens=90)
    assert t.add(pin("a", 40, arrival=1), resident=True) == (True, [])
    assert t.add(pin("b", 40, arrival=2), resident=True) == (True, [])
    assert t.pinned_tokens == 80 > t.budget_tokens
    t.check_integrity()
    assert t.add(pin("c", 5, arrival=3)) == (False, [])  # budget held by earlier programs
    stored, released = t.add(pin("early", 20, arrival=0), resident=True)
    assert stored and [p.program_id for p in released] == ["b"]
    assert PinTable(50).add(pin("x", 60), resident=True) == (False, [])  # no ceiling given: the budget
    t.check_integrity()


def test_budget_refuses_a_pin_from_the_latest_program():
    t = PinTable(50)
    t.add(pin("early", 40, arrival=1))
    newcomer = pin("latest", 20, arrival=9)
    assert t.add(newcomer) == (False, [])
    assert "latest" not in t and t.pinned_tokens == 40


def test_refusal_is_decided_before_anything_is_shed():
    """Shedding a later program cannot make room when the rest is held by earlier ones: the
    newcomer is refused and the later program keeps its pin (nothing lost, nothing idle)."""
    t = PinTable(100)
    t.add(pin("early", 70, arrival=1))
    t.add(pin("late", 20, arrival=9))
    assert t.add(pin("middle", 40, arrival=5)) == (False, [])
    assert {p.program_id for p in t} == {"early", "late"} and t.pinned_tokens == 90
    t.check_integrity()


def test_shed_respects_rank_and_keep():
    t = PinTable(1000)
    for name, a in (("a", 1), ("b", 5), ("c", 9)):
        t.add(pin(name, arrival=a))
    assert t.pop_latest(keep="c").program_id == "b"  # c kept, stepped over
    assert t.pop_latest(ranked_after=5, keep="c") is None  # only c ranks after 5, and it is kept
    assert t.pop_latest(ranked_after=5).program_id == "c"
    assert t.pop_latest(ranked_after=1) is None and len(t) == 1
    t.check_integrity()


def test_pin_larger_than_budget_is_refused():
    t = PinTable(10)
    big = pin("a", 11)
    assert t.add(big) == (False, []) and len(t) == 0


def test_shed_order_and_clear():
    t = PinTable(1000)
    for i, a in enumerate([2, 7, 4]):
        t.add(pin(f"p{i}", arrival=a))
    assert t.pop_latest().program_id == "p1"
    assert t.pop_latest().program_id == "p2"
    assert len(t.clear()) == 1 and t.pinned_tokens == 0 and t.pop_latest() is None


def test_heaps_stay_bounded_under_churn():
    t = PinTable(10**9)
    for i in range(5000):
        t.add(pin("same", deadline=float(i)))
    assert len(t._by_deadline) <= 2 * len(t) + 65
    assert len(t._by_arrival) <= 2 * len(t) + 65
    t.check_integrity()


def test_negative_budget_rejected():
    with pytest.raises(ValueError):
        PinTable(-1)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"), st.integers(0, 9), st.integers(1, 40), st.floats(0, 10), st.integers(0, 20), st.booleans()
        ),
        st.tuples(st.just("pop"), st.integers(0, 9)),
        st.tuples(st.just("expire"), st.floats(0, 12), st.booleans()),
        st.tuples(st.just("shed")),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(0, 120), extra=st.integers(0, 60), ops=ops)
def test_table_matches_a_reference_model(budget, extra, ops):
    """Every handed-out pin is returned exactly once; the ceiling is never exceeded, nor the budget
    by an ordinary pin's add."""
    t = PinTable(budget, ceiling_tokens=budget + extra)
    live: dict[str, Pin] = {}
    returned: list[Pin] = []
    created: list[Pin] = []
    for op in ops:
        if op[0] == "add":
            _, i, tokens, deadline, arrival, resident = op
            p = pin(f"p{i}", tokens, deadline, arrival)
            created.append(p)
            stored, out = t.add(p, resident=resident)
            assert not stored or t.pinned_tokens <= (budget + extra if resident else budget)
            returned.extend(out)
            for q in out:
                assert live.get(q.program_id) is q
                assert q.program_id == p.program_id or q.arrival_rank > p.arrival_rank  # only later programs shed
                del live[q.program_id]
            if stored:
                live[p.program_id] = p
            else:
                returned.append(p)
        elif op[0] == "pop":
            q = t.pop(f"p{op[1]}")
            if q is not None:
                returned.append(q)
                del live[q.program_id]
        elif op[0] == "expire":
            _, now, hold = op
            out = t.pop_expired(now, (lambda p: p.deadline + 1.0) if hold else (lambda p: None))
            for q in out:
                assert q.deadline <= now
                del live[q.program_id]
            returned.extend(out)
        else:
            q = t.pop_latest()
            if q is not None:
                assert q.arrival_rank == max(p.arrival_rank for p in [*live.values()])
                del live[q.program_id]
                returned.append(q)
        t.check_integrity()
        assert {p.program_id: p for p in t} == live
        assert t.pinned_tokens <= budget + extra
    returned.extend(t.clear())
    assert sorted(map(id, returned)) == sorted(map(id, created))


def test_changed_since_names_exactly_the_programs_whose_pin_came_or_went():
    from sglang_continuum.core import pins as pins_module

    t = PinTable(100)
    v0 = t.version
    t.add(pin("a", 30))
    t.add(pin("b", 20, arrival=1))
    v1 = t.version
    assert t.changed_since(v0) == {"a", "b"} and t.changed_since(v1) == set()
    t.pop("a")
    t.add(pin("c", 60, arrival=2))
    assert t.changed_since(v1) == {"a", "c"}
    v2 = t.version
    t.clear()
    assert t.changed_since(v2) is None  # cleared: every program may have changed
    t2 = PinTable(10**9)
    start = t2.version
    for i in range(pins_module.CHANGE_LOG + 1):
        t2.add(pin(f"p{i}", 1, arrival=i))
    assert t2.changed_since(start) is None  # the log was outrun
    assert t2.changed_since(t2.version - 1) == {f"p{pins_module.CHANGE_LOG}"}
