"""Fair shares between scopes (``core/scopes.py``): with ``program_scope_header``, one sender's burst
of new programs no longer puts every program another sender starts after it behind the whole
burst, in the queue or in the pin table's shedding order; without it, program arrival as before."""

from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.metadata import SCOPE_KEY, parse_program_meta, scope_of
from sglang_continuum.core.pins import Pin, PinTable
from sglang_continuum.core.priority import NEW
from sglang_continuum.core.scopes import ScopeRanks
from tests.support import controller

A, B = scope_of("tenant-a"), scope_of("tenant-b")


def scoped(pid, scope, **params):
    return parse_program_meta({"program_id": pid, SCOPE_KEY: scope, **params}, report=lambda p, w: None)


def keyed(c, tags):
    return sorted(tags, key=lambda t: c.priority_key(t, False))


def test_off_the_rank_is_the_arrival():
    ranks = ScopeRanks(enabled=False)
    assert [ranks.rank(s, n) for n, s in enumerate([A, B, None, A], start=1)] == [1, 2, 3, 4]
    assert len(ranks) == 0


@given(st.lists(st.sampled_from([None, A, B]), min_size=1, max_size=60), st.data())
def test_within_one_scope_ranks_keep_arrival_order_whatever_is_admitted(scopes, data):
    ranks = ScopeRanks(enabled=True)
    given_ranks: dict = {}
    for arrival, scope in enumerate(scopes, start=1):
        rank = ranks.rank(scope, arrival)
        assert all(rank > r for r in given_ranks.get(scope, ()))
        given_ranks.setdefault(scope, []).append(rank)
        if data.draw(st.booleans()):
            ranks.admitted(data.draw(st.sampled_from(sum(given_ranks.values(), []))))
        ranks.check_integrity()


def test_a_burst_of_one_scope_takes_one_place_per_round():
    """A sends ten programs at once, B one after them: B's goes right after A's first, which was
    admitted, not after all ten; A's still keep their own order."""
    ranks = ScopeRanks(enabled=True)
    burst = [ranks.rank(A, n) for n in range(1, 11)]
    ranks.admitted(burst[0])
    late = ranks.rank(B, 11)
    assert burst[0] < late < burst[1]
    assert burst == sorted(burst)
    # an idle scope starts at the clock, not at its old credit
    for r in burst[1:6]:
        ranks.admitted(r)
    again = ranks.rank(B, 12)
    assert burst[5] < again < burst[6]


def test_the_table_is_bounded_and_a_dropped_scope_starts_at_the_clock():
    ranks = ScopeRanks(enabled=True, max_scopes=2)
    first = ranks.rank(A, 1)
    ranks.rank(A, 2)
    ranks.rank(B, 3)
    ranks.rank(None, 4)  # A, least recently seen, is dropped
    assert len(ranks) == 2
    assert ScopeRanks.start(ranks.rank(A, 5)) == ScopeRanks.start(first) == ranks.clock
    ranks.check_integrity()


def test_the_scope_travels_with_and_without_a_program_id():
    assert scoped("run-1", A).scope == A
    idless = parse_program_meta({SCOPE_KEY: B}, report=lambda p, w: None)
    assert not idless.has_program and idless.scope == B
    assert parse_program_meta({"program_id": "run-1"}).scope is None


def test_with_scoped_ids_a_later_senders_first_turn_is_not_queued_behind_anothers_burst():
    """The controller's queue order: tenant A's burst of eight first turns, the first admitted; B's
    first turn goes next, before A's second, and B's request without an id (a program of its own:
    B's second) in the next round, after A's second; without the setting both go last (arrival)."""
    for header, b_after in (("x-tenant", 1), (None, 8)):
        c, _ = controller(program_scope_header=header)
        burst = [c.turn_arrived(scoped(f"a-{i}", A)) for i in range(8)]
        c.turn_admitted(burst[0], 100)
        b = c.turn_arrived(scoped("b-0", B))
        order = keyed(c, burst[1:] + [b])
        assert c.priority_key(b, False)[0] == NEW
        assert order.index(b) == b_after - 1, header
        idless = c.turn_arrived(parse_program_meta({SCOPE_KEY: B}, report=lambda p, w: None))
        assert keyed(c, burst[1:] + [idless]).index(idless) == (1 if header else 7)
        assert keyed(c, burst[1:]) == burst[1:]
        c.check_integrity()


def test_with_scoped_ids_a_full_budget_sheds_the_burst_not_the_later_sender():
    """Pins are shed latest-ranked first: the burst's later programs, not the program another tenant
    started during it (by arrival B's pin is the latest, and was refused)."""
    for header, b_pinned in (("x-tenant", True), (None, False)):
        c, _ = controller(program_scope_header=header, budget=300)
        a = [scoped(f"a-{i}", A) for i in range(4)]
        burst = [c.turn_arrived(meta) for meta in a]
        c.turn_admitted(burst[0], 100)
        b = scoped("b-0", B)
        b_tag = c.turn_arrived(b)
        for tag in (*burst[1:3], b_tag):
            c.turn_admitted(tag, 100)
        for meta in a[:3]:
            c.turn_finished(meta, context_tokens=100, handle=meta.program_id)
        assert {p.program_id for p in c.pins} == {m.program_id for m in a[:3]}
        out = c.turn_finished(b, context_tokens=100, handle="b")
        assert (out.pin is not None) == b_pinned, header
        if b_pinned:
            assert [p.program_id for p in out.release] == [a[2].program_id]
        c.check_integrity()


# -- the pin budget's fair shares (``PinTable(scoped=True)``) -------------------------------------


def pin(pid, tokens, rank, scope=None):
    return Pin(pid, tokens, deadline=100.0, arrival_rank=rank, created=0.0, scope=scope)


def test_a_scope_over_its_share_gives_back_its_later_ranked_pins_to_another():
    """A holds the whole budget: B's pin sheds A's latest pin ranked after it, as unscoped; ranked
    after all of A's, it is refused (shares protect a scope's pins, they take nobody's place)."""
    for b_rank, shed in ((5, ["a3"]), (50, [])):
        table = PinTable(400, scoped=True)
        for i in range(4):
            assert table.add(pin(f"a{i}", 100, rank=10 + i, scope=A))[0]
        stored, released = table.add(pin("b0", 100, rank=b_rank, scope=B))
        assert stored == bool(shed) and [p.program_id for p in released] == shed
        table.check_integrity()


def test_a_scope_over_its_share_never_sheds_anothers_within_it():
    """A holds 300 of 400, B 100 (its share is 200): A's next pin, ranked before B's, may shed only
    A's own later pins; with none, it is refused. Unscoped, it shed B's (the latest ranked)."""
    for scoped, shed in ((True, []), (False, ["b0"])):
        table = PinTable(400, scoped=scoped)
        table.add(pin("b0", 100, rank=50, scope=B))
        for i in range(3):
            table.add(pin(f"a{i}", 100, rank=10 + i, scope=A))
        stored, released = table.add(pin("a9", 100, rank=1, scope=A))
        assert [p.program_id for p in released if p.program_id != "a9"] == (["a2"] if scoped else shed)
        assert stored
        table.check_integrity()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "pop", "latest"]), st.integers(0, 11), st.integers(1, 150), st.integers(0, 30)
        ),
        max_size=80,
    ),
    st.booleans(),
)
def test_one_scope_sheds_exactly_as_unscoped_and_shares_stay_in_step(ops, many):
    """Whatever the operations: with every pin in one scope the scoped table makes the unscoped
    table's decisions; with three scopes its shares stay consistent with its pins."""
    plain, shared = PinTable(500), PinTable(500, scoped=True)
    scopes = [A, B, None] if many else [A]
    for op, n, tokens, rank in ops:
        pid, scope = f"p{n}", scopes[n % len(scopes)]
        if op == "add":
            got = shared.add(pin(pid, tokens, rank, scope))
            if not many:
                want = plain.add(pin(pid, tokens, rank, scope))
                assert (got[0], [p.program_id for p in got[1]]) == (want[0], [p.program_id for p in want[1]])
        elif op == "pop":
            shared.pop(pid)
            plain.pop(pid)
        else:
            got, want = shared.pop_latest(), plain.pop_latest()
            if not many:
                assert (got and got.program_id) == (want and want.program_id)
        shared.check_integrity()
        assert shared.pinned_tokens <= 500
