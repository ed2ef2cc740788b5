"""Program metadata of Anthropic Messages requests: Claude Code's session, the client's own keys,
and the attribution block that would defeat the prefix cache."""

import orjson
import pytest

from sglang_continuum.core.anthropic_messages import (
    PROGRAM_PREFIX,
    conversation_digest,
    program_params,
    session_of,
    strip_attribution,
)

SESSION = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]
SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch=36ee5;"},
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
]
FIRST = [{"role": "user", "content": "fix the failing test"}]


def params(**overrides):
    request = {"session_header": SESSION, "metadata": None, "system": strip_attribution(SYSTEM), "messages": FIRST}
    return program_params(**{**request, "tools": TOOLS, **overrides})


def test_the_attribution_block_goes_and_nothing_else():
    assert strip_attribution(SYSTEM) == SYSTEM[1:]
    assert strip_attribution(SYSTEM[1:]) is not None and strip_attribution(SYSTEM[1:]) == SYSTEM[1:]
    assert strip_attribution(SYSTEM[0]["text"] + "\nYou are Claude Code.") == "You are Claude Code."
    assert strip_attribution("You are Claude Code.") == "You are Claude Code."
    assert strip_attribution(None) is None


@pytest.mark.parametrize(
    "header, metadata",
    [
        (SESSION, None),
        (None, {"user_id": f"user_0a1b_account_c2d3_session_{SESSION}"}),
        (None, {"user_id": orjson.dumps({"device_id": "d", "account_uuid": "", "session_id": SESSION}).decode()}),
        (f"  {SESSION} ", {"user_id": "user_x_account_y_session_other"}),  # the header wins
    ],
)
def test_claude_codes_session_from_each_place_it_sends_it(header, metadata):
    assert session_of(header, metadata) == SESSION


@pytest.mark.parametrize(
    "header, metadata",
    [
        (None, None),
        ("", {}),
        ("a b", None),
        ("x" * 200, None),
        (None, {"user_id": "{not json"}),
        (None, {"user_id": 7}),
    ],
)
def test_no_session_from_malformed_values(header, metadata):
    assert session_of(header, metadata) is None


def test_every_turn_of_one_conversation_is_one_program_whatever_the_attribution_says():
    first = params()
    later_system = [{**SYSTEM[0], "text": SYSTEM[0]["text"].replace("36ee5", "0aaa9")}, SYSTEM[1]]
    later = params(
        system=strip_attribution(later_system),
        messages=FIRST + [{"role": "assistant", "content": "ran it"}, {"role": "user", "content": "now?"}],
    )
    assert first["program_id"] == later["program_id"]
    assert first["program_id"].startswith(PROGRAM_PREFIX + SESSION + "/")


def test_a_subagent_and_a_side_request_are_not_the_main_conversation():
    main = params()["program_id"]
    subagent = params(system=[{"type": "text", "text": "You are a search subagent."}])["program_id"]
    assert subagent != main and subagent.startswith(PROGRAM_PREFIX + SESSION)
    assert params(tools=None) is None  # no tools: a side request, served as a single shot
    assert params(tools=[]) is None


def test_the_clients_own_metadata_wins_and_a_side_request_ends_nothing():
    assert params(metadata={"program_id": "run-7", "is_last_step": True}) == {
        "program_id": "run-7",
        "is_last_step": True,
    }
    assert params(session_header=None, metadata={"job_id": "j"}) == {"job_id": "j"}
    assert params(tools=None, metadata={"is_last_step": True, "tool_name": "bash"}) == {"tool_name": "bash"}


def test_the_digest_reads_a_bounded_prefix_of_the_conversation():
    long = "x" * 100_000
    assert conversation_digest(long, [{"role": "user", "content": "a"}]) == conversation_digest(
        long + "tail", [{"role": "user", "content": "a"}]
    )
    assert conversation_digest("s", [{"role": "user", "content": "a"}]) != conversation_digest(
        "s", [{"role": "user", "content": "b"}]
    )
