"""The field's agent-trace formats, imported as workload programs (``continuum-import --format``).

* ``weka``: kv-cache-tester JSON traces of Claude Code sessions (github.com/callanjfox/kv-cache-tester,
  the format AIPerf and inference-perf replay). Token counts only: per request ``t``, ``in``,
  ``out``, ``stop``, ``think_time``, ``api_time``; ``{"type": "subagent", "requests": [...]}``
  entries nest a sub-agent's requests.
* ``agentperf``: agentperf-local replay traces (one JSONL per task, one row per model call with the
  conversation so far in ``messages``, ``recorded_prompt_tokens``, ``target_output_tokens`` /
  ``recorded_completion_tokens``, ``simulated_tool_delay_ms_after`` and
  ``recorded_tool_calls_after[*].{duration_ms, tool_name, action}``).
* ``lmcache``: LMCache/lmcache-agent-trace JSONL (one line per model call: ``timestamp`` in
  microseconds, ``input`` (the prompt as flat text), ``output``, ``session_id``), recorded from
  mini-swe-agent, tau-bench and MetaGPT.

How a trace becomes programs (docs/trace-import.md has the why):

* A request extends its program's context: append = ``in[n] - in[n-1] - out[n-1]`` (``weka``,
  ``agentperf``: recorded counts), or the tokens of the text that ``input[n]`` adds to the input it
  extends (``lmcache``). The workload model keeps every output in the context, so a growth below 1
  (the agent dropped part of an output, e.g. thinking) is clamped to 1 and the replayed context is
  that many tokens longer than the recorded one.
* A context that shrinks (a compaction, a fresh conversation) starts a new program; so does an
  ``lmcache`` input that extends none of the session's earlier inputs. Sub-agents are programs of
  their own.
* The gap before a request is the previous turn's tool time: ``think_time`` (``weka``; without it
  ``t[n] - t[n-1] - api_time[n-1]``, the replayer's own fallback), ``simulated_tool_delay_ms_after``
  (``agentperf``), the gap between two calls' start timestamps (``lmcache``, which records no end
  time: an upper bound that includes the model's own time for the earlier call).
* A program whose context exceeds ``max_context`` tokens, or whose requests lack a needed field, is
  left out and reported (file, line or request index, why); the rest imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

from continuum_lab.workloads.schema import Program, Turn
from sglang_continuum.core.tool_calls import command_tool, from_text

Counter = Callable[[str], int]
FORMATS = ("messages", "weka", "agentperf", "lmcache")
TOOL_USE, HUMAN, SUBAGENT, UNKNOWN = "tool_use", "human", "subagent", "unknown"


def chars_per_4(text: str) -> int:
    """Token estimate when no tokenizer is given: one token per 4 characters (rounded up)."""
    return (len(text) + 3) // 4


def content_text(content: Any) -> str:
    """An OpenAI message's ``content`` as text (a string, or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def message_text(m: dict) -> str:
    """What an OpenAI-format message puts in the context: its text, then each tool call's
    ``name(arguments)``."""
    parts = [content_text(m.get("content"))]
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    return "\n".join(p for p in parts if p)


@dataclass
class ImportResult:
    programs: list[Program] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "where: what", one per program left out

    def extend(self, other: "ImportResult") -> None:
        self.programs += other.programs
        self.problems += other.problems


@dataclass
class _Draft:
    """A program being built: turns plus where it came from (for problem reports)."""

    program_id: str
    where: str
    turns: list[Turn] = field(default_factory=list)
    problem: Optional[str] = None
    context: int = 0  # tokens appended and generated so far

    def add(self, append: int, output: int, text: Optional[str] = None) -> None:
        self.turns.append(Turn(append_tokens=max(1, append), output_tokens=max(1, output), text=text))
        self.context += max(1, append) + max(1, output)

    def set_tool(self, tool: str, seconds: float) -> None:
        """The tool the last turn calls and how long it runs before the next turn."""
        last = self.turns[-1]
        self.turns[-1] = last.model_copy(update={"tool": tool, "tool_duration_s": max(0.0, float(seconds))})


def _finish(drafts: list[_Draft], max_context: Optional[int]) -> ImportResult:
    out = ImportResult()
    for d in drafts:
        if d.problem is None and not d.turns:
            d.problem = "no requests"
        if d.problem is None and max_context is not None and d.context > max_context:
            d.problem = f"context {d.context} tokens > --max-context {max_context}"
        if d.problem is not None:
            out.problems.append(f"{d.where}: program {d.program_id} left out: {d.problem}")
            continue
        last = d.turns[-1]
        d.turns[-1] = last.model_copy(update={"tool": None, "tool_duration_s": 0.0})
        out.programs.append(Program(program_id=d.program_id, turns=d.turns))
    return out


def _number(r: dict, key: str) -> Optional[float]:
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


# --- weka (kv-cache-tester) ---------------------------------------------------------------------


def _weka_agent(requests: list, pid: str, where: str, drafts: list[_Draft]) -> None:
    """One agent's request list (the parent's or a sub-agent's) -> programs; sub-agents recurse."""
    mine: list[_Draft] = []
    prev: Optional[dict] = None
    subagent_since_prev = False
    for i, r in enumerate(requests):
        at = f"{where}[{i}]"
        if not isinstance(r, dict):
            mine.append(_Draft(f"{pid}-bad{i}", at, problem="not an object"))
            continue
        if r.get("type") == "subagent":
            name = str(r.get("agent_id") or f"sa{i}")
            sub = r.get("requests")
            if isinstance(sub, list):
                _weka_agent(sub, f"{pid}/{name}", f"{at}.requests", drafts)
            else:
                drafts.append(_Draft(f"{pid}/{name}", at, problem="sub-agent without requests"))
            subagent_since_prev = True
            continue
        missing = [k for k in ("t", "in", "out") if _number(r, k) is None]
        if missing:
            # The program this request belongs to is left out; the next request starts a new one.
            if prev is not None:
                mine[-1].problem = mine[-1].problem or f"{at}: missing or bad {', '.join(missing)}"
            else:
                mine.append(
                    _Draft(f"{pid}-{len(mine)}" if mine else pid, at, problem=f"missing or bad {', '.join(missing)}")
                )
            prev, subagent_since_prev = None, False
            continue
        n_in, n_out = int(r["in"]), int(r["out"])
        if prev is None or n_in < prev["in"]:
            mine.append(_Draft(pid if not mine else f"{pid}-{len(mine)}", at))
            mine[-1].add(n_in, n_out)
        else:
            gap = _number(r, "think_time")
            if gap is None:
                gap = float(r["t"]) - float(prev["t"]) - (_number(prev, "api_time") or 0.0)
            tool = SUBAGENT if subagent_since_prev else TOOL_USE if prev.get("stop") == "tool_use" else HUMAN
            mine[-1].set_tool(tool, gap)
            mine[-1].add(n_in - prev["in"] - prev["out"], n_out)
        prev, subagent_since_prev = r, False
    drafts.extend(mine)


def import_weka(path: Path, max_context: Optional[int] = None) -> ImportResult:
    try:
        data = orjson.loads(Path(path).read_bytes())
    except orjson.JSONDecodeError as exc:
        return ImportResult(problems=[f"{path}: not JSON: {exc}"])
    traces = data if isinstance(data, list) else [data]
    drafts: list[_Draft] = []
    for n, trace in enumerate(traces):
        where = f"{path}" if len(traces) == 1 else f"{path}[{n}]"
        if not isinstance(trace, dict) or not isinstance(trace.get("requests"), list):
            drafts.append(_Draft(f"{Path(path).stem}-{n}", where, problem="no 'requests' list"))
            continue
        pid = str(trace.get("id") or f"{Path(path).stem}-{n}")
        _weka_agent(trace["requests"], pid, f"{where} requests", drafts)
    return _finish(drafts, max_context)


# --- agentperf-local ----------------------------------------------------------------------------


def _messages_text(messages: list) -> str:
    return "\n".join(message_text(m) for m in messages if isinstance(m, dict))


def _agentperf_tool(row: dict) -> str:
    for call in row.get("recorded_tool_calls_after") or []:
        if not isinstance(call, dict):
            continue
        name = call.get("tool_name")
        command = (call.get("action") or {}).get("command") if isinstance(call.get("action"), dict) else None
        exe = command_tool(command) if isinstance(command, str) else None
        if isinstance(name, str) and name:
            return f"{name}:{exe}" if exe and name in ("bash", "shell", "terminal") else name
        if exe:
            return exe
    return UNKNOWN


def import_agentperf(
    path: Path, count: Counter, max_context: Optional[int] = None, keep_text: bool = False
) -> ImportResult:
    rows: list[tuple[int, dict]] = []
    drafts: list[_Draft] = []
    for lineno, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            drafts.append(_Draft(f"{Path(path).stem}-line{lineno}", f"{path}:{lineno}", problem=f"not JSON: {exc}"))
            continue
        if not isinstance(row, dict):
            drafts.append(_Draft(f"{Path(path).stem}-line{lineno}", f"{path}:{lineno}", problem="not an object"))
            continue
        rows.append((lineno, row))
    by_conv: dict[str, list[tuple[int, dict]]] = {}
    for lineno, row in rows:
        conv = str(row.get("conversation_id") or row.get("task_id") or Path(path).stem)
        by_conv.setdefault(conv, []).append((lineno, row))
    for conv, items in by_conv.items():
        items.sort(key=lambda x: (x[1].get("conversation_idx", 0), x[0]))
        mine: list[_Draft] = []
        prev: Optional[tuple[int, int, list]] = None  # prompt tokens, output tokens, messages
        for lineno, row in items:
            at = f"{path}:{lineno}"
            msgs = row.get("messages") if isinstance(row.get("messages"), list) else None
            prompt = _number(row, "recorded_prompt_tokens")
            if prompt is None and msgs is not None:
                prompt = count(_messages_text(msgs))
            output = _number(row, "target_output_tokens")
            output = _number(row, "recorded_completion_tokens") if output is None else output
            if prompt is None or output is None:
                # The program this row belongs to is left out; the next row starts a new one.
                what = "recorded_prompt_tokens (or messages)" if prompt is None else "target_output_tokens"
                if prev is not None:
                    mine[-1].problem = mine[-1].problem or f"{at}: missing {what}"
                else:
                    mine.append(_Draft(f"{conv}-{len(mine)}" if mine else conv, at, problem=f"missing {what}"))
                prev = None
                continue
            prompt, output = int(prompt), int(output)
            extends = prev is not None and prompt >= prev[0]
            if extends and msgs is not None and prev[2] is not None:
                extends = msgs[: len(prev[2])] == prev[2]
            if not extends:
                mine.append(_Draft(conv if not mine else f"{conv}-{len(mine)}", at))
                new_msgs = msgs or []
                mine[-1].add(prompt, output, _messages_text(new_msgs) if keep_text else None)
            else:
                new_msgs = (msgs or [])[len(prev[2] or []) :]
                mine[-1].add(prompt - prev[0] - prev[1], output, _messages_text(new_msgs) if keep_text else None)
            delay = _number(row, "simulated_tool_delay_ms_after")
            if delay is None:
                delay = sum(_number(c, "duration_ms") or 0.0 for c in row.get("recorded_tool_calls_after") or [])
            mine[-1].set_tool(_agentperf_tool(row), delay / 1000.0)
            prev = (prompt, output, msgs)
        drafts.extend(mine)
    return _finish(drafts, max_context)


# --- LMCache agent traces -----------------------------------------------------------------------


def import_lmcache(
    path: Path, count: Counter, max_context: Optional[int] = None, keep_text: bool = False
) -> ImportResult:
    calls: dict[str, list[tuple[int, int, dict]]] = {}
    drafts: list[_Draft] = []
    for lineno, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        at = f"{path}:{lineno}"
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            drafts.append(_Draft(f"{Path(path).stem}-line{lineno}", at, problem=f"not JSON: {exc}"))
            continue
        bad = [k for k in ("timestamp", "input", "output") if k not in row] if isinstance(row, dict) else ["all"]
        if not bad and not (isinstance(row["input"], str) and isinstance(row["output"], str)):
            bad = ["input/output text"]
        if not bad and _number(row, "timestamp") is None:
            bad = ["timestamp"]
        if bad:
            drafts.append(_Draft(f"{Path(path).stem}-line{lineno}", at, problem=f"missing or bad {', '.join(bad)}"))
            continue
        session = str(row.get("session_id") or Path(path).stem)
        calls.setdefault(session, []).append((int(row["timestamp"]), lineno, row))
    for session, items in calls.items():
        items.sort(key=lambda x: (x[0], x[1]))  # lines are not in time order in the recordings
        open_: list[tuple[_Draft, dict, int]] = []  # program, its last call, that call's timestamp
        for ts, lineno, row in items:
            text = row["input"]
            best = None  # the program whose last call this input extends the most of
            for k, (_, last, _) in enumerate(open_):
                for prefix in (last["input"] + last["output"], last["input"]):
                    if text.startswith(prefix) and (best is None or len(prefix) > best[1]):
                        best = (k, len(prefix))
                        break
            if best is None:
                d = _Draft(session if not open_ else f"{session}-{len(open_)}", f"{path}:{lineno}")
                d.add(count(text), count(row["output"]), text if keep_text else None)
                open_.append((d, row, ts))
                continue
            k, matched = best
            d, last, last_ts = open_[k]
            tool = from_text(last["output"]) or UNKNOWN
            d.set_tool(tool, (ts - last_ts) / 1e6)
            added = text[matched:]
            d.add(count(added), count(row["output"]), added if keep_text else None)
            open_[k] = (d, row, ts)
        drafts.extend(d for d, _, _ in open_)
    return _finish(drafts, max_context)
