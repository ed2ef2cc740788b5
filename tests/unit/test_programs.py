from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.door import WorkingSet
from sglang_continuum.core.programs import ProgramRegistry


def test_tool_return_is_next_arrival_minus_previous_finish():
    r = ProgramRegistry()
    state, ret = r.turn_arrived("p", 10.0, rank=1)
    assert ret is None and state.arrival_rank == 1
    r.turn_finished("p", 12.0, "bash", 100)
    state, ret = r.turn_arrived("p", 13.5, rank=7)
    assert ret.tool == "bash" and ret.seconds == 1.5
    assert state.arrival_rank == 1 and state.turns_arrived == 2  # program keeps its first arrival
    r.check_integrity()


def test_a_program_with_a_turn_in_flight_outlives_the_idle_timeout():
    r = ProgramRegistry(idle_timeout_s=1)
    r.turn_arrived("p", 0.0, rank=1)  # its turn waits (or runs) for longer than the timeout
    r.turn_arrived("q", 0.5, rank=2)
    r.turn_finished("q", 0.5, "t", 10)
    r.forget_idle(2.0)
    assert "p" in r and "q" not in r and r.get("p").arrival_rank == 1
    r.check_integrity()


def test_no_tool_return_without_a_finished_turn_or_after_abort():
    r = ProgramRegistry()
    r.turn_arrived("p", 0.0, rank=1)
    r.turn_finished("p", 1.0, "t", 10)
    r.turn_arrived("p", 2.0, rank=2)
    r.turn_aborted("p", 2.5)
    _, ret = r.turn_arrived("p", 3.0, rank=3)
    assert ret is None


def test_concurrent_turns_of_one_program():
    r = ProgramRegistry()
    r.turn_arrived("p", 0.0, rank=1)
    r.turn_arrived("p", 0.1, rank=2)
    assert r.get("p").in_flight == 2
    r.turn_finished("p", 1.0, "a", 10)
    r.turn_finished("p", 1.1, "b", 12)
    assert r.get("p").in_flight == 0 and r.get("p").turns_finished == 2


def test_straggler_after_the_last_step_does_not_bring_the_program_back():
    """A turn finishing after its program ended must not re-create it with a fresh (earliest)
    rank: that pin would be shed last and rank first."""
    r = ProgramRegistry()
    r.turn_arrived("p", 0.0, rank=5)
    r.turn_arrived("p", 0.1, rank=6)
    r.turn_finished("p", 1.0, "t", 10)
    r.forget("p")  # last step
    assert r.turn_finished("p", 1.2, "t", 12) is None and "p" not in r


def test_idle_programs_are_forgotten_and_size_is_capped():
    r = ProgramRegistry(max_programs=3, idle_timeout_s=10)
    for i in range(5):
        r.turn_arrived(f"p{i}", float(i), rank=i)
        r.turn_finished(f"p{i}", float(i), "t", 10)  # out on a tool, nothing in flight
    assert len(r) == 3 and "p0" not in r and r.forgotten == 2
    assert {s.program_id for s in r.drain_forgotten()} == {"p0", "p1"}  # overflow is reported
    r.turn_arrived("p2", 20.0, rank=9)  # p2 is active again
    r.forget_idle(25.0)
    assert {s.program_id for s in r.drain_forgotten()} == {"p3", "p4"} and "p2" in r
    assert r.drain_forgotten() == []
    r.check_integrity()


def watched(*, window_s: float = 30.0, final_context_window: int = 64, **kw) -> tuple[ProgramRegistry, WorkingSet]:
    """A registry whose notices keep a working set (the door's, ``core/door.py``)."""
    ws = WorkingSet(window_s=window_s, final_context_window=final_context_window)
    return ProgramRegistry(watcher=ws, **kw), ws


def test_working_set_counts_admitted_programs_until_they_go_quiet():
    r, ws = watched(window_s=5.0)
    r.turn_arrived("a", 0.0, rank=1)
    r.turn_arrived("b", 0.0, rank=2)
    assert ws.tokens == 0  # nobody admitted yet
    r.turn_admitted("a", 0.1, 300)
    r.turn_admitted("b", 0.2, 200)
    r.turn_finished("a", 1.0, "t", 350)
    assert (len(ws), ws.tokens) == (2, 550)
    r.turn_finished("b", 2.0, "t", 260)
    r.forget_idle(6.5)  # a unseen for 5.5 s: out; b seen 4.5 s ago: in
    assert (len(ws), ws.tokens) == (1, 260)
    r.forget("b")
    assert (len(ws), ws.tokens) == (0, 0)
    r.check_integrity()


def test_programs_are_expected_to_grow_as_far_as_the_ones_that_ended():
    r, ws = watched(final_context_window=2)
    assert ws.expected_final_context == 0  # nothing ended yet: today's sizes
    for pid, final in (("a", 4000), ("b", 2000), ("c", 3000)):
        for _ in range(2):  # programs of more than one turn teach how far programs grow
            r.turn_arrived(pid, 0.0, rank=1)
            r.turn_admitted(pid, 0.0, final)
            r.turn_finished(pid, 0.0, "t", final)
        r.forget(pid)
    r.turn_arrived("never-admitted", 0.0, rank=2)
    r.forget("never-admitted")  # no context: says nothing
    assert ws.expected_final_context == 2500  # the last two: (2000 + 3000) / 2
    r.turn_arrived("small", 0.0, rank=3)
    r.turn_admitted("small", 0.0, 500)
    r.turn_arrived("large", 0.0, rank=4)
    r.turn_admitted("large", 0.0, 2800)
    assert ws.tokens == 3300 and ws.reserved_tokens() == 2500 + 2800
    r.turn_finished("small", 1.0, "t", 900)
    assert ws.reserved_tokens() == 5300  # still below the expectation
    ws.let_go(r.get("large"))  # a turn of it runs: it stays
    assert ws.reserved_tokens() == 5300
    r.turn_finished("large", 1.0, "t", 2900)
    ws.let_go(r.get("large"))
    assert ws.reserved_tokens() == 2500
    r.check_integrity()


ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "admit", "finish", "abort", "forget", "idle", "let_go"]),
        st.integers(0, 5),
        st.integers(1, 500),
        st.floats(0, 3),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_registry_invariants_hold_under_any_event_sequence(ops):
    r, ws = watched(max_programs=4, idle_timeout_s=20.0, window_s=4.0, final_context_window=3)
    now, rank = 0.0, 0
    for op, i, tokens, dt in ops:
        now += dt
        pid = f"p{i}"
        if op == "arrive":
            rank += 1
            r.turn_arrived(pid, now, rank)
        elif op == "admit":
            state = r.get(pid)
            if state is not None and state.turns_admitted < state.turns_arrived:  # each turn once
                r.turn_admitted(pid, now, tokens)
        elif op in ("finish", "abort"):
            state = r.get(pid)
            if state is None or state.in_flight == 0:  # the engine ends only turns it has
                continue
            if op == "finish":
                r.turn_finished(pid, now, "t", tokens)
            else:
                r.turn_aborted(pid, now)
        elif op == "forget":
            r.forget(pid)
        elif op == "let_go":
            ws.let_go(r.get(pid))
        else:
            r.forget_idle(now)
        r.drain_forgotten()
        r.check_integrity()
        ws.check_integrity()


def test_a_turn_waiting_long_does_not_keep_the_others_in_the_working_set():
    # A's turn waits from t=2 for longer than the window; B was last seen at t=5 and is out on a
    # tool with nothing in flight: it must leave the working set, whatever A does
    reg, ws = watched(window_s=30.0)
    reg.turn_arrived("a", 0.0, 1)
    reg.turn_admitted("a", 1.0, 1000)
    reg.turn_finished("a", 1.5, "bash", 1000)
    reg.turn_arrived("a", 2.0, 2)  # waits (in flight)
    reg.turn_arrived("b", 3.0, 3)
    reg.turn_admitted("b", 4.0, 700)
    reg.turn_finished("b", 5.0, "bash", 700)
    for now in (40.0, 100.0, 800.0):
        reg.forget_idle(now)
        assert len(ws) == 1 and ws.tokens == 1000  # a alone
        reg.check_integrity()
        ws.check_integrity()


def test_the_bound_never_drops_a_program_with_a_turn_in_flight():
    r = ProgramRegistry(max_programs=3)
    r.turn_arrived("live", 0.0, rank=0)  # its turn waits or runs
    for i, pid in enumerate(["a", "b"], start=1):
        r.turn_arrived(pid, float(i), rank=i)
        r.turn_finished(pid, float(i), "t", 10)
    state, _ = r.turn_arrived("new", 3.0, rank=3)
    assert state is not None and "live" in r and "a" not in r  # the oldest idle one went
    r.check_integrity()


def test_a_full_registry_of_programs_it_may_not_drop_refuses_new_ids():
    pinned = {"b"}
    r = ProgramRegistry(max_programs=2, holds_memory=lambda s: s.program_id in pinned)
    r.turn_arrived("a", 0.0, rank=0)  # in flight
    r.turn_arrived("b", 1.0, rank=1)
    r.turn_finished("b", 1.0, "t", 10)  # out on a tool, its pin holds its context
    assert r.turn_arrived("x", 2.0, rank=2) == (None, None) and r.refused == 1
    assert "a" in r and "b" in r and "x" not in r and r.drain_forgotten() == []
    pinned.clear()  # b's pin ended: room frees for the next new id
    state, _ = r.turn_arrived("y", 3.0, rank=3)
    assert state is not None and "b" not in r
    r.check_integrity()


def test_a_flood_of_one_turn_ids_churns_only_programs_that_never_came_back():
    r = ProgramRegistry(max_programs=4)
    r.turn_arrived("agent", 0.0, rank=0)
    r.turn_finished("agent", 0.5, "bash", 100)
    r.turn_arrived("agent", 1.0, rank=1)  # came back from a tool: no longer on probation
    r.turn_finished("agent", 1.5, "bash", 200)  # out on its next tool call, nothing in flight
    for i in range(1_000):  # distinct ids, one request each
        t = 2.0 + i
        r.turn_arrived(f"x{i}", t, rank=2 + i)
        r.turn_finished(f"x{i}", t, None, 10)
    assert "agent" in r and r.get("agent").arrival_rank == 0 and r.refused == 0
    assert len(r) == 4 and r.forgotten == 1_000 - 3
    r.check_integrity()


def test_a_program_passed_over_by_the_bound_counts_as_seen():
    r = ProgramRegistry(max_programs=2, idle_timeout_s=10.0)
    r.turn_arrived("a", 0.0, rank=0)  # in flight from t=0
    r.turn_arrived("b", 1.0, rank=1)
    r.turn_finished("b", 1.0, "t", 10)
    r.turn_arrived("c", 5.0, rank=2)  # drops b, passing over a
    assert "b" not in r and r.get("a").last_seen == 5.0
    r.check_integrity()


def test_single_requests_and_programs_the_bound_dropped_teach_no_final_context():
    """One client sending many single requests under ids of their own (a per-request session id)
    must not pull every program's growth reservation down; nor does a program dropped to make room
    for a new id say where programs end."""
    r, ws = watched(max_programs=3)
    for turn in range(3):  # an agent of three turns ends at 3,000 tokens
        r.turn_arrived("agent", float(turn), rank=1)
        r.turn_admitted("agent", float(turn), 1000 * (turn + 1))
        r.turn_finished("agent", float(turn), "bash", 1000 * (turn + 1))
    r.forget("agent")
    assert ws.expected_final_context == 3000
    for i in range(200):  # single requests, 10 tokens, each ended by its client
        r.turn_arrived(f"x{i}", 10.0 + i, rank=2 + i)
        r.turn_admitted(f"x{i}", 10.0 + i, 10)
        r.turn_finished(f"x{i}", 10.0 + i, None, 10)
        if i % 2:
            r.forget(f"x{i}")  # ended; the others are dropped by the bound
    assert ws.expected_final_context == 3000
    for i in range(20):  # two-turn programs of 20 tokens, dropped by the bound, never ended
        t = 300.0 + i
        for _ in range(2):
            r.turn_arrived(f"y{i}", t, rank=300 + i)
            r.turn_admitted(f"y{i}", t, 20)
            r.turn_finished(f"y{i}", t, "bash", 20)
    assert r.forgotten >= 20 and ws.expected_final_context == 3000
    r.check_integrity()
    ws.check_integrity()


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(["arrive", "finish", "pin", "unpin"]), st.integers(0, 40), st.floats(0, 2)),
        max_size=120,
    )
)
def test_the_bound_drops_no_program_with_a_turn_in_flight_or_a_pin_whatever_ids_arrive(events):
    """Adversarial ids into a registry of 6: whatever arrives, a program with a turn in flight or
    a pin is never dropped by the bound, and a refused id leaves the registry as it was."""
    pinned: set[str] = set()
    r = ProgramRegistry(max_programs=6, holds_memory=lambda s: s.program_id in pinned)
    now = 0.0
    for rank, (op, i, dt) in enumerate(events):
        now += dt
        pid = f"p{i}"
        protected = {s.program_id for s in r if s.in_flight > 0 or s.program_id in pinned}
        if op == "arrive":
            before = set(s.program_id for s in r)
            state, _ = r.turn_arrived(pid, now, rank)
            if state is None:
                assert set(s.program_id for s in r) == before and pid not in r
        elif op == "finish" and pid in r and r.get(pid).in_flight:
            r.turn_finished(pid, now, "t", 10)
        elif op == "pin" and pid in r:
            pinned.add(pid)
        elif op == "unpin":
            pinned.discard(pid)
        dropped = {s.program_id for s in r.drain_forgotten()}
        assert not dropped & protected, f"the bound dropped {dropped & protected}"
        pinned &= {s.program_id for s in r}
        r.check_integrity()


def test_a_one_turn_program_whose_client_announced_its_end_still_teaches_its_final_context():
    # a recorded session of one request, ended by its client's last-step flag, is a program
    r, ws = watched()
    state, _ = r.turn_arrived("one", 0.0, rank=1)
    state.announces_end = True
    r.turn_admitted("one", 0.0, 900)
    r.turn_finished("one", 1.0, None, 900)
    r.forget("one")
    assert ws.expected_final_context == 900
