"""The shipped agent tasks and the command grammar of ``continuum-agents`` (no server)."""

import json
import re
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from continuum_lab.bench.attribution import turn_rid
from continuum_lab.cli.agents.report import score_attribution
from continuum_lab.cli.agents.tasks import (
    SUBMIT_COMMAND,
    TaskResult,
    TurnRecord,
    build_model,
    command_grammar,
    load_tasks,
)
from sglang_continuum.client.params import routing_headers
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


def _model_args(mode: str, grammar: bool) -> Namespace:
    return Namespace(mode=mode, grammar=grammar, max_tokens=16, temperature=0.0, model_name="tiny")


@pytest.mark.parametrize("mode", ["text", "native"])
def test_plain_model_is_mini_swe_agents_stock_class_with_nothing_but_the_grammar(mode):
    pytest.importorskip("minisweagent", reason="requirements/agents.txt")
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    task = load_tasks(TASKS)[0]
    stock = LitellmTextbasedModel if mode == "text" else LitellmModel
    plain = build_model(task, "http://127.0.0.1:9", "p-1", _model_args(mode, grammar=False), plain=True)
    assert type(plain) is stock  # not a subclass: mini-swe-agent unchanged
    kwargs = plain.config.model_kwargs
    assert "extra_body" not in kwargs and "extra_headers" not in kwargs, kwargs
    assert not hasattr(plain, "close") and not hasattr(plain, "mark_last_step")
    grammared = build_model(task, "http://127.0.0.1:9", "p-1", _model_args(mode, grammar=True), plain=True)
    assert type(grammared) is stock
    assert grammared.config.model_kwargs["extra_body"] == {"ebnf": command_grammar(task.commands, mode)}
    assert "extra_headers" not in grammared.config.model_kwargs
    # with ids the same run carries its program id three ways
    ids = build_model(task, "http://127.0.0.1:9", "p-1", _model_args(mode, grammar=True))
    body = ids.config.model_kwargs["extra_body"]
    assert body["custom_params"]["program_id"] == body["session_id"] == "p-1"
    assert body["ebnf"] == grammared.config.model_kwargs["extra_body"]["ebnf"]
    assert ids.config.model_kwargs["extra_headers"] == routing_headers("p-1")
    ids.close()


def test_attribution_is_scored_per_task_from_response_ids(tmp_path):
    """The log is keyed by SGLang's rid (each response's id); the truth is the task each turn was."""
    runs = [
        TaskResult("a", "run-a", "Submitted", 3, 1.0, [TurnRecord(rid=r) for r in ("a0", "a1", "a2")]),
        TaskResult("b", "run-b", "Submitted", 2, 1.0, [TurnRecord(rid=r) for r in ("b0", "b1")]),
    ]
    rows = [
        ("a0", "inferred-1", "none"),
        ("b0", "inferred-2", "none"),
        ("a1", "inferred-1", "inferred"),
        ("b1", "inferred-1", "inferred"),  # b's second turn taken for a's program: wrong
        ("a2", "inferred-1", "inferred"),
        ("x0", "inferred-3", "none"),  # a request of no task here (ignored)
    ]
    log = tmp_path / "attribution.jsonl"
    log.write_text(
        "".join(json.dumps({"event": "attributed", "rid": r, "program_id": p, "source": s}) + "\n" for r, p, s in rows)
    )
    scored = score_attribution(runs, log)
    assert scored["turns_after_first"] == 3 and scored["attributed_right"] == 2
    assert scored["recall"] == pytest.approx(2 / 3) and scored["precision"] == pytest.approx(2 / 3)
    assert turn_rid("run-a", 0) == "run-a#0"  # the names the scorer keys its truth by


def test_turns_count_format_errors_as_model_calls_and_pair_commands_with_their_messages():
    """mini-swe-agent keeps a format error's response on the ``user`` message it sends back: it is
    a model call (a request with a rid) that ran no command."""
    from types import SimpleNamespace

    from continuum_lab.cli.agents.tasks import _turns

    def response(rid, prompt, cached):
        return {"id": rid, "usage": {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}}

    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": "x",
            "extra": {"actions": [{"command": "ls"}], "response": response("r0", 10, 0)},
        },
        {"role": "user", "content": "obs"},
        {
            "role": "user",
            "content": "format error",
            "extra": {"interrupt_type": "FormatError", "response": response("r1", 20, 12)},
        },
        {
            "role": "assistant",
            "content": "y",
            "extra": {"actions": [{"command": "cat a"}], "response": response("r2", 30, 20)},
        },
        {"role": "user", "content": "obs"},
    ]
    turns = _turns(SimpleNamespace(messages=messages), [("ls", 0.5, 0), ("cat a", 0.25, 1)])
    assert [t.rid for t in turns] == ["r0", "r1", "r2"]
    assert [t.command for t in turns] == ["ls", None, "cat a"]  # not shifted by the format error
    assert [(t.prompt_tokens, t.cached_tokens) for t in turns] == [(10, 0), (20, 12), (30, 20)]
    assert turns[2].tool == "cat" and turns[2].returncode == 1
    assert messages[5]["extra"]["execution_time_seconds"] == 0.25  # for the trajectory importer
