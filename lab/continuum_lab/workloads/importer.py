"""Import real agent trajectories as workload programs.

* OpenAI-format message lists (``messages`` as a list or a JSON string; assistant messages carry
  ``tool_calls[*].execution_time_seconds``), e.g. SWE-agent / SWE-smith trajectories.
* mini-swe-agent trajectory files (``{"messages": [...], "info": ...}``, v1 and v2): the tool is
  the first executable of the assistant's command block (v2 ```` ```mswea_bash_command ````, v1
  ```` ```bash ````) or of its native ``bash`` tool call; mini-swe-agent does not record tool
  times, so a message's ``extra.duration`` / ``execution_time_seconds`` is used when present
  (``continuum-agents`` writes it) and ``default_tool_s`` otherwise.

One assistant message is one turn. Its ``append_tokens`` are the tokens of every message since the
previous assistant message (system prompt and task on the first turn, tool output after), its
``output_tokens`` the assistant's content plus tool-call arguments, all counted with the serving
model's tokenizer. The program ends after its last assistant message (whatever tool it called).

    python -m continuum_lab.workloads.importer TRAJECTORIES.json --tokenizer .models/tiny-llama \\
        --out workloads/swe-smith-5.jsonl

Other formats (``--format weka|agentperf|lmcache``: kv-cache-tester, agentperf-local and LMCache agent
traces) live in ``workloads/formats.py``; docs/trace-import.md describes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional

from continuum_lab.workloads.formats import (
    FORMATS,
    ImportResult,
    chars_per_4,
    content_text,
    import_agentperf,
    import_lmcache,
    import_weka,
    message_text,
)
from continuum_lab.workloads.schema import Program, Turn, dump_workload
from sglang_continuum.core.tool_calls import from_openai_tool_calls, from_text

Counter = Callable[[str], int]


def _duration(m: dict, default: float) -> float:
    calls = m.get("tool_calls") or []
    times = [c.get("execution_time_seconds") for c in calls if c.get("execution_time_seconds") is not None]
    if times:
        return float(sum(times))
    extra = m.get("extra") or {}
    for key in ("duration", "execution_time_seconds"):
        if isinstance(extra.get(key), (int, float)):
            return float(extra[key])
    return default


def messages_to_program(
    program_id: str, messages: list[dict], count: Counter, *, default_tool_s: float = 1.0, keep_text: bool = False
) -> Program:
    turns: list[Turn] = []
    pending: list[str] = []
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistants:
        raise ValueError(f"{program_id}: no assistant messages")
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            pending.append(message_text(m))
            continue
        last = i == assistants[-1]
        appended = "\n".join(pending)
        tool = (
            None
            if last
            else (from_openai_tool_calls(m.get("tool_calls")) or from_text(content_text(m.get("content"))) or "unknown")
        )
        turns.append(
            Turn(
                append_tokens=max(1, count(appended)),
                output_tokens=max(1, count(message_text(m))),
                tool=tool,
                tool_duration_s=0.0 if last else _duration(m, default_tool_s),
                text=appended if keep_text else None,
            )
        )
        pending = []
    return Program(program_id=program_id, turns=turns)


def load_trajectories(path: Path) -> Iterable[tuple[str, list[dict]]]:
    data = json.loads(Path(path).read_text())
    items = data if isinstance(data, list) else [data]
    for n, item in enumerate(items):
        msgs = item.get("messages") if isinstance(item, dict) else item
        msgs = json.loads(msgs) if isinstance(msgs, str) else msgs
        pid = (
            str(item.get("traj_id") or item.get("instance_id") or f"{Path(path).stem}-{n}")
            if isinstance(item, dict)
            else f"{Path(path).stem}-{n}"
        )
        yield pid, msgs


def tokenizer_counter(path: str) -> Counter:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return lambda text: len(tok.encode(text, add_special_tokens=False)) if text else 0


def import_files(paths: list[Path], count: Counter, **kw) -> list[Program]:
    return [messages_to_program(pid, msgs, count, **kw) for p in paths for pid, msgs in load_trajectories(p)]


def import_paths(
    paths: list[Path],
    fmt: str,
    count: Counter,
    *,
    max_context: Optional[int] = None,
    default_tool_s: float = 1.0,
    keep_text: bool = False,
) -> ImportResult:
    """Every file in ``fmt`` -> the programs that fit, and one problem line per program left out."""
    result = ImportResult()
    for path in paths:
        if fmt == "weka":
            result.extend(import_weka(path, max_context))
        elif fmt == "agentperf":
            result.extend(import_agentperf(path, count, max_context, keep_text))
        elif fmt == "lmcache":
            result.extend(import_lmcache(path, count, max_context, keep_text))
        elif fmt == "messages":
            for pid, msgs in load_trajectories(path):
                try:
                    prog = messages_to_program(pid, msgs, count, default_tool_s=default_tool_s, keep_text=keep_text)
                except ValueError as exc:
                    result.problems.append(f"{path}: program {pid} left out: {exc}")
                    continue
                if max_context is not None and prog.context_tokens > max_context:
                    result.problems.append(
                        f"{path}: program {pid} left out: context {prog.context_tokens} tokens > --max-context {max_context}"
                    )
                    continue
                result.programs.append(prog)
        else:
            raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    seen: set[str] = set()
    for prog in result.programs:  # program ids must be unique in a workload
        if prog.program_id in seen:
            raise ValueError(f"duplicate program id {prog.program_id!r} across the input files")
        seen.add(prog.program_id)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Import agent trajectories or traces as a workload (JSONL).")
    ap.add_argument("paths", type=Path, nargs="+")
    ap.add_argument("--format", choices=FORMATS, default="messages", help="input format (docs/trace-import.md)")
    ap.add_argument(
        "--tokenizer",
        help="the serving model's tokenizer (path) for formats with text; without it, 1 token per 4 characters",
    )
    ap.add_argument("--max-context", type=int, help="leave out (and report) programs whose context exceeds this")
    ap.add_argument("--default-tool-s", type=float, default=1.0, help="tool time when none is recorded (messages)")
    ap.add_argument("--keep-text", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    count = tokenizer_counter(args.tokenizer) if args.tokenizer else chars_per_4
    result = import_paths(
        args.paths,
        args.format,
        count,
        max_context=args.max_context,
        default_tool_s=args.default_tool_s,
        keep_text=args.keep_text,
    )
    for problem in result.problems:
        print(problem, file=sys.stderr)
    if not result.programs:
        print("no programs imported", file=sys.stderr)
        return 1
    dump_workload(result.programs, args.out)
    print(
        f"wrote {args.out}: {len(result.programs)} programs, {sum(len(p.turns) for p in result.programs)} turns"
        f", {len(result.problems)} left out"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
