import pytest

from sglang_continuum.core.metadata import (
    NO_PROGRAM,
    MalformedReporter,
    ProgramMeta,
    merge_top_level,
    parse_program_meta,
)


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


def test_top_level_fields_of_the_continuum_authors_client_are_read_as_program_metadata():
    """Their mini-swe-agent fork sends ``job_id`` and ``is_last_step`` at the top level of the
    chat/completions body; merged into ``custom_params`` they read as any program metadata."""
    body = {"model": "m", "messages": [], "job_id": "run-3", "is_last_step": False, "max_tokens": 8}
    merged = merge_top_level(body, None)
    assert merged == {"job_id": "run-3", "is_last_step": False}
    meta = parse_program_meta(merged)
    assert (meta.program_id, meta.is_last_step, meta.announces_end) == ("run-3", False, True)
    body = {"program_id": 7, "last_step": "true", "tool_name": "bash", "step": 2, "temperature": 0.0, "user": "u"}
    assert merge_top_level(body, None) == {"program_id": 7, "last_step": "true", "tool_name": "bash", "step": 2}
    assert merge_top_level({"model": "m", "user": "u", "metadata": {"a": 1}}, None) is None  # nothing of ours


def test_custom_params_win_over_top_level_fields_group_by_group():
    body = {"job_id": "top", "is_last_step": True, "tool_name": "bash"}
    merged = merge_top_level(body, {"program_id": "explicit", "other": 1})
    assert merged == {"program_id": "explicit", "other": 1, "is_last_step": True, "tool_name": "bash"}
    assert parse_program_meta(merged).program_id == "explicit"  # not overridden by the alias
    assert merge_top_level(body, {"job_id": "e", "last_step": False, "tool_name": "t"}) is None
    assert merge_top_level(body, "not a dict") is None  # SGLang's to refuse, parse_program_meta's to report
    assert merge_top_level(None, None) is None and merge_top_level(["job_id"], None) is None


def test_top_level_values_that_would_break_the_request_are_reported_and_ignored():
    """SGLang refuses a request whose custom_params nests: a nested top-level value is dropped
    (reported), never forwarded; a bad scalar is forwarded and reported where it is read."""
    problems = []
    merged = merge_top_level(
        {"job_id": {"nested": {"x": 1}}, "is_last_step": [True], "step": 3}, None, lambda pid, p: problems.append(p)
    )
    assert merged == {"step": 3} and len(problems) == 2 and "job_id" in problems[0]
    report = MalformedReporter(log=lambda *a: None)
    meta = parse_program_meta(merge_top_level({"job_id": "run-1", "is_last_step": "maybe"}, None), report=report)
    assert meta.program_id == "run-1" and not meta.is_last_step and report.count == 1
