"""Program registry: what the policy remembers about each agent program, bounded in size.

A program is forgotten when its last step is served, when it has been idle longer than
``idle_timeout_s`` (a client that vanished), or when the registry is full (least recently seen
first). Forgetting only loses ordering and tool-time information; it never affects correctness.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional


@dataclass(slots=True)
class ProgramState:
    program_id: str
    arrival: float  # first turn's arrival (program-level FCFS key)
    arrival_seq: int  # tie-break for programs that arrive in the same step
    last_seen: float
    turns_arrived: int = 0
    turns_finished: int = 0
    in_flight: int = 0
    last_finish: Optional[float] = None
    pending_tool: Optional[str] = None  # tool called by the last finished turn, not yet returned


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """A program came back from a tool call: ``seconds`` between the previous turn's finish and
    this turn's arrival, attributed to ``tool``."""

    program_id: str
    tool: str
    seconds: float


class ProgramRegistry:
    def __init__(self, *, max_programs: int = 100_000, idle_timeout_s: float = 900.0) -> None:
        if max_programs < 1:
            raise ValueError("max_programs must be >= 1")
        self.max_programs = max_programs
        self.idle_timeout_s = idle_timeout_s
        self._programs: OrderedDict[str, ProgramState] = OrderedDict()  # least recently seen first
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._programs

    def get(self, program_id: str) -> Optional[ProgramState]:
        return self._programs.get(program_id)

    def _touch(self, program_id: str, now: float, seq: int = 0) -> ProgramState:
        state = self._programs.get(program_id)
        if state is None:
            state = ProgramState(program_id, arrival=now, arrival_seq=seq, last_seen=now)
            self._programs[program_id] = state
            while len(self._programs) > self.max_programs:
                self._programs.popitem(last=False)
                self.forgotten += 1
        else:
            state.last_seen = now
            self._programs.move_to_end(program_id)
        return state

    def turn_arrived(
        self, program_id: str, now: float, seq: int
    ) -> tuple[ProgramState, Optional[ToolReturn]]:
        """Record a turn's arrival; ``seq`` (a global arrival counter) orders programs that arrive
        in the same instant, and becomes the program's arrival key if this is its first turn."""
        state = self._touch(program_id, now, seq)
        state.turns_arrived += 1
        state.in_flight += 1
        ret = None
        if state.last_finish is not None and state.pending_tool is not None:
            ret = ToolReturn(program_id, state.pending_tool, max(0.0, now - state.last_finish))
            state.pending_tool = None
        return state, ret

    def turn_finished(self, program_id: str, now: float, tool: Optional[str]) -> ProgramState:
        state = self._touch(program_id, now)
        state.turns_finished += 1
        state.in_flight = max(0, state.in_flight - 1)
        state.last_finish = now
        state.pending_tool = tool
        return state

    def turn_aborted(self, program_id: str, now: float) -> Optional[ProgramState]:
        state = self._programs.get(program_id)
        if state is not None:
            state.in_flight = max(0, state.in_flight - 1)
            state.last_seen = now
            state.pending_tool = None
        return state

    def forget(self, program_id: str) -> Optional[ProgramState]:
        return self._programs.pop(program_id, None)

    def forget_idle(self, now: float) -> list[ProgramState]:
        """Drop programs unseen for ``idle_timeout_s``; O(number dropped)."""
        dropped = []
        cutoff = now - self.idle_timeout_s
        while self._programs:
            pid, state = next(iter(self._programs.items()))
            if state.last_seen > cutoff:
                break
            self._programs.popitem(last=False)
            dropped.append(state)
        self.forgotten += len(dropped)
        return dropped
