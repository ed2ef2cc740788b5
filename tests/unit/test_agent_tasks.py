"""The shipped agent tasks and the command grammar of ``continuum-agents`` (no server)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_continuum.cli.agents import SUBMIT_COMMAND, command_grammar, load_tasks
from sglang_continuum.core.tool_calls import identify_tool

TASKS = Path(__file__).resolve().parents[2] / "workloads" / "tasks"
MSWEA_ACTION = r"```mswea_bash_command\s*\n(.*?)\n```"  # mini-swe-agent 2.4.6's text-mode action regex


def run_tests(repo: Path) -> int:
    return subprocess.run([sys.executable, "-m", "unittest", "-q"], cwd=repo, capture_output=True).returncode


@pytest.mark.parametrize("task", load_tasks(TASKS), ids=lambda t: t.name)
def test_each_shipped_task_fails_until_its_fix_is_applied(task, tmp_path):
    meta = json.loads((TASKS / task.name / "task.json").read_text())
    repo = tmp_path / "repo"
    shutil.copytree(task.repo, repo)
    assert run_tests(repo) != 0
    assert meta["fix"] in task.commands  # the grammar lets the agent make the fix
    subprocess.run(meta["fix"], shell=True, cwd=repo, check=True)
    assert run_tests(repo) == 0


def test_text_grammar_is_valid_ebnf_and_yields_one_mini_swe_agent_action():
    xgrammar = pytest.importorskip("xgrammar")
    commands = ("ls", "sed -i 's/\"a\"/b/' x.py")
    for mode in ("text", "native"):
        xgrammar.Grammar.from_ebnf(command_grammar(commands, mode))  # raises on a bad grammar
    # what the grammar produces is one action for mini-swe-agent and a tool class for the server
    output = f"THOUGHT: I will run the tests.\n\n```mswea_bash_command\n{commands[1]}\n```"
    assert re.findall(MSWEA_ACTION, output, re.DOTALL) == [commands[1]]
    assert identify_tool(output) == "sed"
    submit = f"THOUGHT: I am done.\n\n```mswea_bash_command\n{SUBMIT_COMMAND}\n```"
    assert identify_tool(submit) == "submit"
    assert SUBMIT_COMMAND not in command_grammar(commands, "text", submit=False)
