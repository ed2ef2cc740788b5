"""Workload format: JSONL, one agent program per line.

    {"program_id": "swe-0003", "turns": [
        {"append_tokens": 2400, "output_tokens": 120, "tool": "python", "tool_duration_s": 0.52},
        ...,
        {"append_tokens": 310, "output_tokens": 80, "tool": null, "tool_duration_s": 0.0}]}

* ``append_tokens``: tokens this turn adds to the context before the model runs (the task and
  system prompt on the first turn, the tool output or user message after that).
* ``output_tokens``: tokens the model generates (replay forces exactly this many).
* ``tool`` / ``tool_duration_s``: the tool the turn's output calls and how long it runs before
  the next turn is sent. The last turn calls no tool (``null`` / 0).
* ``text`` (optional): the real text appended, when the workload was imported with it.
* ``group`` (optional, per program): programs of one group send the same first prompt, token for
  token (an RL rollout's samples of one prompt, ``workloads/rollout.py``); their first turns must
  append as many tokens. Every other token a program sends is its own.

A program's context at turn i is every earlier turn's append + output plus this turn's append.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Optional, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    append_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    tool: Optional[str] = None
    tool_duration_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    text: Optional[str] = None


class Program(BaseModel):
    model_config = ConfigDict(extra="forbid")

    program_id: str = Field(min_length=1)
    turns: list[Turn] = Field(min_length=1)
    group: Optional[str] = Field(None, min_length=1)  # shares its first prompt with the group's programs

    @model_validator(mode="after")
    def _last_turn_calls_no_tool(self) -> "Program":
        last = self.turns[-1]
        if last.tool_duration_s != 0.0:
            raise ValueError("the last turn calls no tool: its tool_duration_s must be 0")
        return self

    @property
    def context_tokens(self) -> int:
        """Final context length: everything appended and generated."""
        return sum(t.append_tokens + t.output_tokens for t in self.turns)

    @property
    def prefill_tokens(self) -> int:
        """Tokens sent over all turns if nothing were cached (the re-prefill cost)."""
        total, ctx = 0, 0
        for t in self.turns:
            ctx += t.append_tokens
            total += ctx
            ctx += t.output_tokens
        return total


class WorkloadError(ValueError):
    pass


def _problem(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


Record = TypeVar("Record", bound=BaseModel)


def jsonl_records(lines: Iterable[str | bytes], source: str, model: type[Record]) -> Iterator[tuple[int, Record]]:
    """``(line number, record)`` for each non-blank JSONL line validated as ``model``; a line that is
    not JSON or not a valid record raises ``WorkloadError`` naming ``source`` and the line."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise WorkloadError(f"{source}:{lineno}: not JSON: {exc}") from None
        try:
            yield lineno, model.model_validate(data)
        except ValidationError as exc:
            raise WorkloadError(f"{source}:{lineno}: {_problem(exc)}") from None


def parse_workload(lines: Iterable[str | bytes], source: str = "<workload>") -> list[Program]:
    programs: list[Program] = []
    seen: set[str] = set()
    prompts: dict[str, int] = {}  # group -> its first turn's appended tokens
    for lineno, program in jsonl_records(lines, source, Program):
        if program.program_id in seen:
            raise WorkloadError(f"{source}:{lineno}: duplicate program_id {program.program_id!r}")
        seen.add(program.program_id)
        if program.group is not None:
            first = prompts.setdefault(program.group, program.turns[0].append_tokens)
            if first != program.turns[0].append_tokens:
                raise WorkloadError(
                    f"{source}:{lineno}: group {program.group!r} shares one first prompt of {first} tokens, "
                    f"not {program.turns[0].append_tokens}"
                )
        programs.append(program)
    if not programs:
        raise WorkloadError(f"{source}: no programs")
    return programs


def load_workload(path: str | Path) -> list[Program]:
    path = Path(path)
    with path.open("rb") as f:
        return parse_workload(f, str(path))


def dump_workload(programs: Iterable[Program], path: str | Path) -> Path:
    return dump_jsonl(programs, path)


def dump_jsonl(models: Iterable[BaseModel], path: str | Path) -> Path:
    """One model per line, unset fields left out: the workload formats' writer."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for model in models:
            f.write(orjson.dumps(model.model_dump(exclude_none=True)) + b"\n")
    return path
