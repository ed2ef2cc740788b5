from sglang_continuum.core.programs import ProgramRegistry


def test_tool_return_is_next_arrival_minus_previous_finish():
    r = ProgramRegistry()
    state, ret = r.turn_arrived("p", 10.0, seq=1)
    assert ret is None and state.arrival == 10.0 and state.arrival_seq == 1
    r.turn_finished("p", 12.0, tool="bash")
    state, ret = r.turn_arrived("p", 13.5, seq=7)
    assert ret.tool == "bash" and ret.seconds == 1.5
    assert state.arrival_seq == 1 and state.turns_arrived == 2  # program keeps its first arrival


def test_no_tool_return_without_a_finished_turn_or_after_abort():
    r = ProgramRegistry()
    r.turn_arrived("p", 0.0, seq=1)
    r.turn_finished("p", 1.0, tool="t")
    r.turn_arrived("p", 2.0, seq=2)
    r.turn_aborted("p", 2.5)
    _, ret = r.turn_arrived("p", 3.0, seq=3)
    assert ret is None


def test_concurrent_turns_of_one_program():
    r = ProgramRegistry()
    r.turn_arrived("p", 0.0, seq=1)
    r.turn_arrived("p", 0.1, seq=2)
    assert r.get("p").in_flight == 2
    r.turn_finished("p", 1.0, tool="a")
    r.turn_finished("p", 1.1, tool="b")
    assert r.get("p").in_flight == 0 and r.get("p").turns_finished == 2


def test_idle_programs_are_forgotten_and_size_is_capped():
    r = ProgramRegistry(max_programs=3, idle_timeout_s=10)
    for i in range(5):
        r.turn_arrived(f"p{i}", float(i), seq=i)
    assert len(r) == 3 and "p0" not in r and r.forgotten == 2
    r.turn_arrived("p2", 20.0, seq=9)  # p2 is active again
    dropped = r.forget_idle(25.0)
    assert {s.program_id for s in dropped} == {"p3", "p4"} and "p2" in r
