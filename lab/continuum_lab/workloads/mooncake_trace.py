"""Agent programs as AIPerf's ``mooncake_trace`` multi-turn dataset (what ``continuum-aiperf`` replays).

    python -m continuum_lab.workloads.mooncake_trace workloads/imported/claude-code-kvtester.jsonl \\
        --token-scale 0.05 --programs 100 --out workloads/aiperf/claude-code-cpu.mooncake.jsonl

AIPerf 0.13.0 (``aiperf/dataset/loader/mooncake_trace.py``, ``models.py`` ``MooncakeTrace``) reads
one JSON line per request; lines sharing a ``session_id`` are one conversation, in file order. This
module writes one line per turn:

    {"session_id": "trace_0002", "input_length": 791, "output_length": 8}
    {"session_id": "trace_0002", "input_length": 2, "output_length": 5, "delay": 3000.0}

* ``input_length``: the turn's ``append_tokens``. No ``hash_ids``: AIPerf then synthesises a fresh
  prompt of that many tokens per turn, and under its default multi-turn mode for these traces
  (``deltas_without_responses``) each turn's prompt is a new user message appended to the
  conversation so far, the server's live answers threaded in as assistant messages. That is our
  workload's context model (every earlier append and output, then this turn's append), the
  tokens drawn per session as the replay draws them per program.
* ``output_length``: the turn's ``output_tokens`` (AIPerf sends it as ``max_tokens``; with
  ``ignore_eos`` the server generates exactly that many).
* ``delay`` (ms, turns after the first): the previous turn's ``tool_duration_s``, the time AIPerf
  waits after that turn's answer before it sends this one (its concurrency/rate strategies honour
  it, the session holding its concurrency slot meanwhile). Gaps are kept as recorded unless
  ``--max-gap-s`` caps them here; ``continuum-aiperf --max-gap-s`` caps them at run time with
  AIPerf's own ``--inter-turn-delay-cap-seconds`` instead.
* No ``timestamp``: sessions start when the load generator (``--concurrency`` / ``--request-rate``)
  says, not on a recorded clock.

Sources: a workload JSONL (``workloads/schema.py``, e.g. ``workloads/imported/claude-code-kvtester.jsonl``)
or raw kv-cache-tester traces (``*.json``, read by the importer's ``weka`` format:
``docs/trace-import.md``). ``--token-scale S`` multiplies every token count (rounded, at least 1:
the rule of ``workloads.generate`` and ``scripts/imported_traces.sh``'s ``scale``), so a corpus of
80k-token contexts fits the tiny CPU model; tool times are not scaled. ``--programs N`` keeps N
programs evenly spaced over the source (deterministic, the whole corpus's spread).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import orjson

from continuum_lab.workloads.formats import import_weka
from continuum_lab.workloads.schema import Program, Turn, load_workload


def load_source(paths: Sequence[Path]) -> list[Program]:
    """Programs from workload JSONL files and/or raw kv-cache-tester ``.json`` traces."""
    programs: list[Program] = []
    for path in paths:
        if path.suffix == ".json":
            result = import_weka(path)
            for problem in result.problems:
                print(problem, file=sys.stderr)
            programs += result.programs
        else:
            programs += load_workload(path)
    return programs


def scale_tokens(program: Program, token_scale: float) -> Program:
    """Every token count times ``token_scale``, rounded, at least 1; tool times kept."""
    if token_scale == 1.0:
        return program
    turns = [
        t.model_copy(
            update={
                "append_tokens": max(1, round(t.append_tokens * token_scale)),
                "output_tokens": max(1, round(t.output_tokens * token_scale)),
            }
        )
        for t in program.turns
    ]
    return program.model_copy(update={"turns": turns})


def evenly_spaced(programs: Sequence[Program], n: int) -> list[Program]:
    """``n`` programs spread evenly over ``programs`` (all of them when ``n`` is 0 or more than there are)."""
    if n <= 0 or n >= len(programs):
        return list(programs)
    return [programs[i * len(programs) // n] for i in range(n)]


def mooncake_rows(programs: Iterable[Program], max_gap_s: Optional[float] = None) -> Iterator[dict]:
    """One AIPerf ``mooncake_trace`` row per turn, a program's turns together and in order."""
    for program in programs:
        previous: Optional[Turn] = None
        for turn in program.turns:
            row: dict = {"session_id": program.program_id, "input_length": turn.append_tokens}
            row["output_length"] = turn.output_tokens
            if previous is not None:
                gap_s = previous.tool_duration_s if max_gap_s is None else min(previous.tool_duration_s, max_gap_s)
                row["delay"] = round(gap_s * 1000.0, 3)
            yield row
            previous = turn


def write_trace(programs: Sequence[Program], out: Path, max_gap_s: Optional[float] = None) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        for row in mooncake_rows(programs, max_gap_s):
            f.write(orjson.dumps(row) + b"\n")
    return out


def read_trace(path: Path) -> list[Program]:
    """A multi-turn ``mooncake_trace`` file back as programs (the pool is sized from them): each
    row's ``delay`` is the previous turn's tool time."""
    sessions: dict[str, list[dict]] = defaultdict(list)
    with Path(path).open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = orjson.loads(line)
            if "input_length" not in row or "session_id" not in row:
                raise ValueError(f"{path}:{lineno}: a multi-turn row needs session_id and input_length")
            sessions[str(row["session_id"])].append(row)
    programs = []
    for session_id, rows in sessions.items():
        gaps = [float(r.get("delay") or 0.0) / 1000.0 for r in rows[1:]] + [0.0]
        turns = [
            Turn(
                append_tokens=int(r["input_length"]), output_tokens=int(r.get("output_length") or 1), tool_duration_s=g
            )
            for r, g in zip(rows, gaps)
        ]
        programs.append(Program(program_id=session_id, turns=turns))
    return programs


def summary(programs: Sequence[Program]) -> str:
    contexts = sorted(p.context_tokens for p in programs)
    turns = sum(len(p.turns) for p in programs)
    return (
        f"{len(programs)} sessions, {turns} turns, final context median {contexts[len(contexts) // 2]} "
        f"tokens, max {contexts[-1]}"
    )


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="continuum-aiperf-trace", description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path, help="workload .jsonl or kv-cache-tester .json traces")
    ap.add_argument("--token-scale", type=float, default=1.0, help="every token count times this (>= 1 each)")
    ap.add_argument("--programs", type=int, default=0, help="keep this many programs, evenly spaced (0: all)")
    ap.add_argument("--max-context", type=int, default=0, help="leave out programs whose scaled context is longer")
    ap.add_argument("--max-gap-s", type=float, default=None, help="cap the gaps in the file (default: as recorded)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.token_scale <= 0:
        ap.error("--token-scale must be positive")
    programs = [scale_tokens(p, args.token_scale) for p in load_source(args.sources)]
    if args.max_context:
        kept = [p for p in programs if p.context_tokens <= args.max_context]
        print(f"{len(programs) - len(kept)} programs over --max-context {args.max_context} left out", file=sys.stderr)
        programs = kept
    programs = evenly_spaced(programs, args.programs)
    if not programs:
        ap.error("no programs to write")
    write_trace(programs, args.out, args.max_gap_s)
    print(f"{args.out}: {summary(programs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
