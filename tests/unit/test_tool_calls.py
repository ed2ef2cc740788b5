import json
from pathlib import Path

import pytest

from sglang_continuum.core.tool_calls import first_executable, from_openai_tool_calls, from_text, identify_tool

DATA = (
    Path(__file__).resolve().parents[1] / "data" / "swe_smith_5_trajectories_with_tool_times.json"
)  # see tests/data/README.md


def trajectories():
    for traj in json.loads(DATA.read_text()):
        msgs = traj["messages"]
        yield json.loads(msgs) if isinstance(msgs, str) else msgs


def test_real_swe_agent_tool_calls_all_parse():
    names = []
    for msgs in trajectories():
        for m in msgs:
            if m.get("tool_calls"):
                names.append(from_openai_tool_calls(m["tool_calls"]))
    assert len(names) == 125 and None not in names
    assert names.count("str_replace_editor") == 55 and names.count("submit") == 10
    bash = [n for n in names if n.startswith("bash:")]
    assert len(bash) == 60
    assert {"bash:python", "bash:grep", "bash:find", "bash:rm"} <= set(bash)
    assert "bash:cd" not in bash  # `cd /testbed && python x.py` is a python run


@pytest.mark.parametrize(
    "command,expected",
    [
        ("cd /testbed && python reproduce.py", "python"),
        ("cd /testbed", "cd"),
        ("find /testbed -name '*.py' | xargs grep -l x | head -5", "find"),
        ("FOO=1 timeout 30 pytest -q tests/", "pytest"),
        ("sudo apt-get install -y x; ls", "apt-get"),
        ("/usr/bin/python3 -m pytest", "python3"),
        ("echo 'a && b' && ls", "echo"),
        ('grep -n "unbalanced', "grep"),
    ],
)
def test_first_executable(command, expected):
    assert first_executable(command) == expected


MINI_SWE = """THOUGHT: I need to look at the failing test first.

```bash
cd /testbed && python -m pytest tests/test_core.py -x -q
```"""

QWEN3 = """<think>
The user wants the weather. I could call ```bash
ls``` but no, I should use the tool.
</think>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>"""

TERMINAL_BENCH = json.dumps(
    {
        "analysis": "Need to inspect files.",
        "plan": "list",
        "commands": [{"keystrokes": "ls -la /app\n", "duration": 0.1}],
    }
)


@pytest.mark.parametrize(
    "text,expected",
    [
        (MINI_SWE, "python"),
        (QWEN3, "get_weather"),
        (TERMINAL_BENCH, "ls"),
        ('[web_search(query="sglang"), fetch_url(url="x")]', "web_search"),
        ('Calling {"name": "fetch_url", "parameters": {"url": "http://x"}} now', "fetch_url"),
        ('{"type": "function", "function": {"name": "lookup", "arguments": "{}"}}', "lookup"),
        ("<think>long reasoning that never closes ```bash\nrm -rf /\n```", None),
        ("Just an answer, no tool.", None),
    ],
)
def test_text_formats(text, expected):
    assert from_text(text) == expected


def test_client_tool_wins_and_unknown_is_stable():
    assert identify_tool(MINI_SWE, client_tool="search") == "search"
    assert identify_tool("plain prose") == "unknown" == identify_tool(None)
    calls = [{"function": {"name": "bash", "arguments": json.dumps({"command": "cd /x && git diff"})}}]
    assert identify_tool(MINI_SWE, tool_calls=calls) == "bash:git"


# mini-swe-agent 2.4.6 text mode (``LitellmTextbasedModel``): one ```mswea_bash_command block a turn
MSWEA_STEP = "THOUGHT: let me look at the tests first.\n\n```mswea_bash_command\ncd /repo && python -m pytest -q\n```"
MSWEA_SUBMIT = "THOUGHT: done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


@pytest.mark.parametrize(
    "text, expected",
    [
        (MSWEA_STEP, "python"),
        (MSWEA_SUBMIT, "submit"),
        ("```bash\necho MINI_SWE_AGENT_FINAL_OUTPUT && git diff\n```", "submit"),  # v1 sentinel
        ("```mswea_bash_command\necho hello\n```", "echo"),  # an ordinary echo is not a submit
    ],
)
def test_mini_swe_agent_v2_text_blocks(text, expected):
    assert identify_tool(text) == expected


def test_mini_swe_agent_v2_native_tool_calls():
    """v2's default mode: one ``bash`` function with a ``command`` argument."""

    def call(command):
        return [{"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]

    assert identify_tool(tool_calls=call("grep -rn foo src")) == "bash:grep"
    assert identify_tool(tool_calls=call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")) == "submit"
