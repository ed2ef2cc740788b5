"""Which tool did a finished turn call? Pure-text parsers for the common agent formats.

Order of evidence: a tool name sent by the client; structured OpenAI ``tool_calls``; then the
output text with any ``<think>...</think>`` removed first (reasoning models), tried as
``<tool_call>`` tags, Terminal-bench JSON (``commands[].keystrokes``), a JSON call object,
a Llama pythonic call list, and a mini-swe-agent command block (v1 ```` ```bash ````, v2
```` ```mswea_bash_command ````). Anything else is ``UNKNOWN_TOOL``, a stable class that still
feeds the global statistics.

Some tools end the program: a command that prints a submit sentinel (mini-swe-agent v2's
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, v1's ``MINI_SWE_AGENT_FINAL_OUTPUT``) is classed
as ``SUBMIT_TOOL``, which the controller treats as the program's last step (see
``ContinuumSettings.terminal_tools``): the agent never comes back after it.

Shell commands are classed by their first executable, and ``cd DIR && cmd`` is classed as
``cmd``. The SWE-agent sample decides little by itself (``python -m continuum_lab.cli.analyze_tool_classes``): all
60 bash calls take about 0.5 s, and the pooled within-class spread is 22.9 ms keeping ``cd`` vs
24.0 ms skipping it. What it does show is that 24 of the 25 ``cd`` calls are ``cd /testbed &&
python ...``, whose durations match the bare ``python`` calls; keeping ``cd`` would name a class
after a directory change and split one distribution in two. On real repositories test runs are
the long, variable calls, so they must keep their own class.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any, Iterable, Optional

from sglang_continuum.core.tool_stats import UNKNOWN_TOOL

MAX_TOOL_LEN = 64
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_OPEN_THINK = re.compile(r"<think>.*\Z", re.S | re.I)
_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_BASH_BLOCK = re.compile(r"```(?:mswea_bash_command|bash|sh|shell)\s*\n(.*?)```", re.S)
SUBMIT_TOOL = "submit"
# The first line of output that makes mini-swe-agent end the run (v2, then v1).
SUBMIT_SENTINELS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
_PYTHONIC = re.compile(r"^\s*\[\s*([A-Za-z_][\w.]*)\s*\(", re.S)
_SEPARATORS = {"&&", "||", ";", "|", "&"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = {"sudo", "time", "timeout", "env", "nohup", "exec", "command"}


def strip_thinking(text: str) -> str:
    text = _THINK.sub("", text)
    return _OPEN_THINK.sub("", text)  # an unclosed <think> (truncated output) is all thinking


def _clean(name: Any) -> Optional[str]:
    if not isinstance(name, str):
        return None
    name = name.strip()
    return name[:MAX_TOOL_LEN] if name else None


SHELL_FUNCTIONS = {"bash", "shell", "terminal", "execute_bash", "run_command", "run_shell_command"}


def from_openai_tool_calls(tool_calls: Optional[Iterable[dict]], *, skip_cd: bool = True) -> Optional[str]:
    """The first call's function name; a shell-like function is refined by its command's first
    executable (``bash:python``), since "bash" alone lumps every command together."""
    for call in tool_calls or ():
        fn = call.get("function") if isinstance(call, dict) else None
        name = _clean((fn or {}).get("name") if isinstance(fn, dict) else None)
        if not name:
            continue
        if name in SHELL_FUNCTIONS:
            args = fn.get("arguments")
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except ValueError:
                args = None
            cmd = args.get("command") if isinstance(args, dict) else None
            exe = command_tool(cmd, skip_cd=skip_cd) if isinstance(cmd, str) else None
            if exe == SUBMIT_TOOL:
                return SUBMIT_TOOL
            if exe:
                return _clean(f"{name}:{exe}")
        return name
    return None


def _json_objects(text: str) -> Iterable[Any]:
    """Every JSON value that starts at a '{' or '[' in ``text`` (cheap scan, first hits first)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        yield value


def _name_of_json_call(value: Any) -> Optional[str]:
    if isinstance(value, list):
        return next((n for n in map(_name_of_json_call, value) if n), None)
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):
        return _clean(value["function"].get("name"))
    if "name" in value and ("arguments" in value or "parameters" in value):
        return _clean(value["name"])
    return None


def command_tool(command: str, *, skip_cd: bool = True) -> Optional[str]:
    """The tool class of a shell command: ``SUBMIT_TOOL`` for a submit sentinel, else its first
    executable."""
    if any(sentinel in command for sentinel in SUBMIT_SENTINELS):
        return SUBMIT_TOOL
    return first_executable(command, skip_cd=skip_cd)


def first_executable(command: str, *, skip_cd: bool = True) -> Optional[str]:
    """First executable of the first sub-command (split on && || ; | &), skipping ``cd X``
    sub-commands when more follow, variable assignments and wrappers such as ``sudo``."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: fall back to whitespace
        tokens = command.split()
    commands: list[list[str]] = [[]]
    for tok in tokens:
        if tok in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(tok)
    commands = [c for c in commands if c]
    for i, words in enumerate(commands):
        while words and (_ASSIGNMENT.match(words[0]) or words[0] in _WRAPPERS):
            words = words[1:]
            while words and (words[0].startswith("-") or words[0].isdigit()):
                words = words[1:]  # wrapper options (timeout 10, env -i)
        if not words:
            continue
        exe = os.path.basename(words[0])
        if skip_cd and exe == "cd" and i + 1 < len(commands):
            continue
        return _clean(exe)
    return None


def from_text(text: str, *, skip_cd: bool = True) -> Optional[str]:
    text = strip_thinking(text)
    if not text.strip():
        return None
    for body in _TOOL_CALL_TAG.findall(text):
        name = next((n for n in map(_name_of_json_call, _json_objects(body)) if n), None)
        if name:
            return name
    block = _BASH_BLOCK.search(text)
    if block is None:  # JSON forms: Terminal-bench commands, then a JSON call object
        for value in _json_objects(text):
            if isinstance(value, dict) and isinstance(value.get("commands"), list):
                for cmd in value["commands"]:
                    keys = cmd.get("keystrokes") if isinstance(cmd, dict) else None
                    if isinstance(keys, str) and keys.strip():
                        return command_tool(keys, skip_cd=skip_cd)
            name = _name_of_json_call(value)
            if name:
                return name
        m = _PYTHONIC.match(text)
        if m:
            return _clean(m.group(1))
        return None
    return command_tool(block.group(1), skip_cd=skip_cd)


def identify_tool(
    text: Optional[str] = None,
    *,
    client_tool: Optional[str] = None,
    tool_calls: Optional[Iterable[dict]] = None,
    skip_cd: bool = True,
) -> str:
    return (
        _clean(client_tool)
        or from_openai_tool_calls(tool_calls, skip_cd=skip_cd)
        or (from_text(text, skip_cd=skip_cd) if text else None)
        or UNKNOWN_TOOL
    )
