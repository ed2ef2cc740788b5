import pytest

from sglang_continuum.core.metadata import NO_PROGRAM, MalformedReporter, ProgramMeta, parse_program_meta


def test_reads_program_id_last_step_and_tool():
    m = parse_program_meta({"program_id": "agent-7", "is_last_step": True, "tool_name": "bash"})
    assert (m.program_id, m.is_last_step, m.tool_name) == ("agent-7", True, "bash")


@pytest.mark.parametrize("value,expected", [(1, True), (0, False), ("true", True), ("no", False), (None, False)])
def test_last_step_spellings(value, expected):
    assert parse_program_meta({"program_id": 3, "is_last_step": value}).is_last_step is expected


def test_aliases_and_session_id_fallback():
    assert parse_program_meta({"job_id": 5, "last_step": True}).program_id == "5"
    assert parse_program_meta(None, session_id="s-1").program_id == "s-1"
    assert parse_program_meta({"program_id": "x"}, session_id="s-1").program_id == "x"


def test_program_id_sources_in_order_of_trust():
    both = {"routing_key": "rk", "session_id": "s"}
    assert parse_program_meta({"program_id": "p"}, **both).identified_by == "program_id"
    assert parse_program_meta(None, **both).program_id == "s"
    assert parse_program_meta(None, **both).identified_by == "session_id"
    m = parse_program_meta({"is_last_step": True, "tool_name": "bash"}, routing_key="rk")
    assert (m.program_id, m.identified_by, m.is_last_step, m.tool_name) == ("rk", "routing_key", True, "bash")
    assert parse_program_meta(None).identified_by == "none"
    assert ProgramMeta("by-hand").identified_by == "program_id"  # tests and tools build metas directly


def test_malformed_routing_key_is_reported_and_ignored():
    problems = []
    m = parse_program_meta(None, routing_key="bad\nkey", report=lambda pid, p: problems.append(p))
    assert m is NO_PROGRAM and problems and problems[0].startswith("routing_key")
    # a malformed session id falls through to the routing key
    m = parse_program_meta(None, session_id="", routing_key="rk", report=lambda pid, p: problems.append(p))
    assert (m.program_id, m.identified_by) == ("rk", "routing_key")


def test_no_metadata_is_no_program():
    assert parse_program_meta(None) is NO_PROGRAM
    assert parse_program_meta({"temperature_hint": 1}) is NO_PROGRAM


@pytest.mark.parametrize(
    "params",
    [{"program_id": ["a"]}, {"program_id": ""}, {"program_id": True}, {"program_id": "x" * 1000}, "garbage", 17],
)
def test_malformed_program_id_is_ignored_not_raised(params):
    problems = []
    assert parse_program_meta(params, report=lambda pid, p: problems.append(p)) is NO_PROGRAM
    assert problems


def test_malformed_flag_keeps_program_and_is_reported_once():
    logged = []
    rep = MalformedReporter(log=lambda *a: logged.append(a))
    for _ in range(5):
        m = parse_program_meta({"program_id": "p", "is_last_step": "maybe", "tool_name": 3}, report=rep)
        assert m.program_id == "p" and m.is_last_step is False and m.tool_name is None
    assert len(logged) == 2 and rep.count == 10  # two distinct problems, each logged once


def test_reporter_memory_is_bounded():
    rep = MalformedReporter(max_entries=8, log=lambda *a: None)
    for i in range(100):
        rep(f"p{i}", "bad")
    assert len(rep._seen) == 8


@pytest.mark.parametrize("pid", ["a\nFAKE LOG LINE", "esc\x1b[31m", "nul\x00", "tab\tid"])
def test_program_ids_with_control_characters_are_rejected_not_logged_raw(pid):
    problems = []
    meta = parse_program_meta({"program_id": pid}, None, lambda p, problem: problems.append((p, problem)))
    assert meta == NO_PROGRAM  # served as under fcfs
    assert problems and problems[0][0] is None
    assert "\n" not in problems[0][1] and "\x1b" not in problems[0][1] and "\x00" not in problems[0][1]


def test_step_is_read_and_a_bad_one_is_reported_not_fatal():
    assert parse_program_meta({"program_id": "p", "step": 3}).step == 3
    assert parse_program_meta({"program_id": "p", "step": "2"}).step == 2
    problems = []
    for bad in (0, -1, "two", True, 1.5):
        meta = parse_program_meta({"program_id": "p", "step": bad}, report=lambda pid, why: problems.append(why))
        assert meta.program_id == "p" and meta.step is None
    assert len(problems) == 5
