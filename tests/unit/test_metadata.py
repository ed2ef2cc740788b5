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


def test_malformed_reports_are_rate_bounded_and_counted_exactly():
    """A client sending a new malformed value with every request logs at most ``max_lines`` per
    window, then one line saying how many were not logged; the count stays exact."""
    now, logged = [0.0], []
    rep = MalformedReporter(log=lambda *a: logged.append(a), max_lines=5, window_s=60.0, clock=lambda: now[0])
    for i in range(1000):
        assert parse_program_meta({"program_id": f"bad\n{i}"}, report=rep) is NO_PROGRAM
    assert len(logged) == 5 and rep.count == 1000 and rep.suppressed == 995
    now[0] = 61.0
    parse_program_meta({"program_id": "bad\nagain"}, report=rep)
    assert len(logged) == 7 and 995 in logged[5]  # the suppressed count, then the new report
    assert "bad" in str(logged[6])


@pytest.mark.parametrize(
    "params",
    [
        {"program_id": 10**5000},
        {"program_id": "p", "is_last_step": 10**5000},
        {"program_id": "p", "tool_name": 10**5000},
        {"program_id": "p", "step": 10**5000},
        {"program_id": "p", "step": "9" * 5000},
    ],
)
def test_integers_past_pythons_string_conversion_limit_are_malformed_not_raised(params):
    """``str`` and ``repr`` of an int over 4,300 digits raise ValueError in CPython."""
    problems = []
    meta = parse_program_meta(params, report=lambda pid, why: problems.append(why))
    assert isinstance(meta, ProgramMeta) and meta.step is None and not meta.is_last_step and meta.tool_name is None
    assert len(problems) == 1 and len(problems[0]) < 300


# -- property tests: adversarial draws for every key -------------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_continuum.core.metadata import (  # noqa: E402
    LAST_STEP_ALIASES,
    PROGRAM_ID_ALIASES,
    RESERVED_PREFIX,
    SCOPE_KEY,
    STEP_KEY,
    TOOL_NAME_KEY,
    is_scope,
    scope_of,
    scoped_program_id,
)

_reserved_ids = st.builds(lambda tail: RESERVED_PREFIX + tail, st.text(max_size=30)) | st.sampled_from(
    [RESERVED_PREFIX + "inferred-7", f" {RESERVED_PREFIX}inferred-1 ", scoped_program_id(scope_of("a"), "run-1")]
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.builds(lambda digits: -(10**digits) if digits % 2 else 10**digits, st.sampled_from([20, 401, 5000]))
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # control characters, surrogates, bidi overrides included
    | st.text(alphabet="\x00\x1b\n\r\t\u202e\ud800 ab", max_size=20)
    | _reserved_ids
    | st.builds(scope_of, st.text(max_size=8))
)
_json = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4)
)
_keys = st.sampled_from([*PROGRAM_ID_ALIASES, *LAST_STEP_ALIASES, TOOL_NAME_KEY, STEP_KEY, SCOPE_KEY]) | st.text(
    max_size=8
)


@given(
    custom_params=st.dictionaries(_keys, _json, max_size=8) | _json,
    session_id=_json,
    routing_key=_json,
)
def test_the_parser_never_raises_and_never_accepts_an_id_in_the_reserved_namespace(
    custom_params, session_id, routing_key
):
    problems = []
    meta = parse_program_meta(custom_params, session_id, lambda pid, why: problems.append(why), routing_key=routing_key)
    assert isinstance(meta, ProgramMeta)
    assert all(isinstance(p, str) and len(p) < 400 for p in problems)
    if meta.program_id is None:
        return
    assert meta.program_id.isprintable()
    scope = custom_params.get(SCOPE_KEY) if isinstance(custom_params, dict) else None
    if scope is None:  # unscoped: the client's own id, never the plugin's namespace
        assert not meta.program_id.startswith(RESERVED_PREFIX)
        return
    assert is_scope(scope)  # a malformed scope is no program
    prefix = scoped_program_id(scope, "")
    assert meta.program_id.startswith(prefix)
    assert not meta.program_id[len(prefix) :].startswith(RESERVED_PREFIX)
