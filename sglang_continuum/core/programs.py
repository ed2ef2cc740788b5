"""Program registry: what the policy remembers about each agent program, bounded in size.

A program is forgotten when its last step is served, when it has been idle longer than
``idle_timeout_s`` (a client that vanished), or when the registry is full (least recently seen
first). Every forgotten program is handed back to the owner (``drain_forgotten``) so that nothing
it held (a pin, a host pin) outlives it.

The registry also keeps the **working set**: the current context tokens of programs that have
been admitted at least once and were seen within ``working_set_window_s`` (longer with a host
tier, where a program's KV waits out a tool call unpinned) -- the programs the pool should hold
for their next turn. Program-level admission control reads it. The owner lets a
program go sooner (``let_go``) when the policy keeps none of its KV while it is out on a tool (and
there is no host tier for it to wait on).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Iterator, Optional

MAX_PROGRAMS = 100_000
PROGRAM_IDLE_TIMEOUT_S = 900.0  # a program unseen this long, with nothing in flight, is forgotten
WORKING_SET_WINDOW_S = 30.0  # a program unseen this long (out on a tool) leaves the working set
# ... with a host tier, where a program out on a tool keeps its KV without a pin: long enough for
# most tool calls to come back (recorded Claude Code: p90 66 s), short enough that sessions gone
# for minutes do not keep new ones out
HOST_TIER_WORKING_SET_WINDOW_S = 120.0
FINAL_CONTEXT_WINDOW = 64  # ended programs whose final contexts give the expected one


def affine_slot(program_id: str, slots: int) -> int:
    """A stable slot in ``range(slots)`` for a program (the same in every process and run, unlike
    ``hash``): how turns of one program keep reaching the same data-parallel rank."""
    if slots < 1:
        raise ValueError("slots must be >= 1")
    digest = hashlib.blake2b(program_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % slots


@dataclass(slots=True)
class ProgramState:
    program_id: str
    arrival_rank: int  # program-level FCFS rank: the arrival order of its first turn
    last_seen: float
    turns_arrived: int = 0
    turns_admitted: int = 0
    turns_finished: int = 0
    in_flight: int = 0
    last_finish: Optional[float] = None
    pending_tool: Optional[str] = None  # tool called by the last finished turn, not yet returned
    context_tokens: int = 0  # its context as of its latest admitted or finished turn
    first_step: Optional[int] = None  # the client's step number of the first turn seen here
    pin_shed: bool = False  # its last pin was shed (not expired, not hit) and it has not come back yet
    pin_lost_waiting: bool = False  # its pin was shed while its next turn waited: that turn missed
    announces_end: bool = False  # its client flags the last step (else its end is presumed from silence)
    longest_gap: float = 0.0  # the longest it has been away on a tool call and come back
    gaps: int = 0  # tool calls it came back from


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """A program came back from a tool call: ``seconds`` between the previous turn's finish and
    this turn's arrival, attributed to ``tool``."""

    program_id: str
    tool: str
    seconds: float


class ProgramRegistry:
    def __init__(
        self,
        *,
        max_programs: int = MAX_PROGRAMS,
        idle_timeout_s: float = PROGRAM_IDLE_TIMEOUT_S,
        working_set_window_s: float = WORKING_SET_WINDOW_S,
        final_context_window: int = FINAL_CONTEXT_WINDOW,
    ) -> None:
        if max_programs < 1:
            raise ValueError("max_programs must be >= 1")
        self.max_programs = max_programs
        self.idle_timeout_s = idle_timeout_s
        self.working_set_window_s = working_set_window_s
        self._programs: OrderedDict[str, ProgramState] = OrderedDict()  # least recently seen first
        self._working: OrderedDict[str, None] = OrderedDict()  # admitted, seen in the window; LRU
        self.working_set_tokens = 0
        self._forgotten: list[ProgramState] = []  # dropped by overflow or idleness, not yet drained
        self.forgotten = 0
        # the contexts programs had when they ended or were forgotten: how far a program grows
        self._final_contexts: deque[int] = deque(maxlen=final_context_window)
        self._final_sum = 0
        # working programs below the expected final context E: [E, count, tokens], kept up to date on
        # every context change and rebuilt (O(working set)) only when E moves, i.e. when a program ends
        self._short: Optional[list[int]] = None

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._programs

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self._programs.values())

    def get(self, program_id: str) -> Optional[ProgramState]:
        return self._programs.get(program_id)

    @property
    def working_programs(self) -> int:
        return len(self._working)

    @property
    def expected_final_context(self) -> int:
        """The mean context of the last programs that ended (0 before any did)."""
        n = len(self._final_contexts)
        return self._final_sum // n if n else 0

    def reserved_tokens(self) -> int:
        """What the working set will need: each program in it at least the expected final context,
        ``sum(max(context, E))`` = today's tokens plus the shortfall of those below E (O(1); O(working
        set) once after E moved)."""
        expected = self.expected_final_context
        if self._short is None or self._short[0] != expected:
            below = [c for pid in self._working if (c := self._programs[pid].context_tokens) < expected]
            self._short = [expected, len(below), sum(below)]
        _, count, tokens = self._short
        return self.working_set_tokens + expected * count - tokens

    def reservation_added(self, program_id: str, context_tokens: int, floor: int) -> int:
        """How much a working-set reservation of ``sum(max(context, floor))`` grows once a turn of
        ``program_id`` with ``context_tokens`` is admitted (a program out of the working set comes
        back into it whole)."""
        new = max(context_tokens, floor)
        state = self._programs.get(program_id)
        if state is None or program_id not in self._working:
            return new
        return max(0, new - max(state.context_tokens, floor))

    # -- events --------------------------------------------------------------------------
    def turn_arrived(self, program_id: str, now: float, rank: int) -> tuple[ProgramState, Optional[ToolReturn]]:
        """Record a turn's arrival; ``rank`` (a global arrival counter) becomes the program's
        arrival rank if this is its first turn."""
        state = self._programs.get(program_id)
        if state is None:
            state = ProgramState(program_id, arrival_rank=rank, last_seen=now)
            self._programs[program_id] = state
            while len(self._programs) > self.max_programs:
                _, dropped = self._programs.popitem(last=False)
                self._drop(dropped)
        else:
            self._touch(state, now)
        state.turns_arrived += 1
        state.in_flight += 1
        ret = None
        if state.last_finish is not None and state.pending_tool is not None:
            ret = ToolReturn(program_id, state.pending_tool, max(0.0, now - state.last_finish))
            state.pending_tool = None
            state.longest_gap = max(state.longest_gap, ret.seconds)
            state.gaps += 1
        return state, ret

    def turn_admitted(self, program_id: str, now: float, context_tokens: int) -> Optional[ProgramState]:
        state = self._programs.get(program_id)
        if state is not None:
            state.turns_admitted += 1
            self._touch(state, now)
            self._set_context(state, context_tokens)
        return state

    def turn_finished(
        self, program_id: str, now: float, tool: Optional[str], context_tokens: int
    ) -> Optional[ProgramState]:
        """None for a straggler: a turn of a program already ended or forgotten (it must not
        bring the program back with a new rank)."""
        state = self._programs.get(program_id)
        if state is None:
            return None
        self._touch(state, now)
        state.turns_finished += 1
        state.in_flight = max(0, state.in_flight - 1)
        state.last_finish = now
        state.pending_tool = tool
        if context_tokens > 0:
            self._set_context(state, context_tokens)
        return state

    def turn_aborted(self, program_id: str, now: float) -> Optional[ProgramState]:
        state = self._programs.get(program_id)
        if state is not None:
            state.in_flight = max(0, state.in_flight - 1)
            state.pending_tool = None
            self._touch(state, now)
        return state

    def forget(self, program_id: str, *, learn: bool = True) -> Optional[ProgramState]:
        """``learn``: its context counts among programs' final contexts (not for one that was no
        program after all)."""
        state = self._programs.pop(program_id, None)
        if state is not None:
            self._leave_working_set(state)
            if learn:
                self._record_final_context(state)
        return state

    def forget_idle(self, now: float) -> None:
        """Drop programs unseen for ``idle_timeout_s`` that have no turn in flight (to
        ``drain_forgotten``) and let programs unseen for ``working_set_window_s`` leave the working
        set; O(number dropped or refreshed)."""
        cutoff = now - self.idle_timeout_s
        while self._programs:
            state = next(iter(self._programs.values()))
            if state.last_seen > cutoff:
                break
            if state.in_flight > 0:
                # a turn of it waits (or runs): the program is alive, whatever its last event.
                # Forgetting it would re-register its next turn with a new, latest rank.
                self._touch(state, now)
                continue
            self._programs.popitem(last=False)
            self._drop(state)
        cutoff = now - self.working_set_window_s
        while self._working:
            state = self._programs[next(iter(self._working))]
            if state.last_seen > cutoff:
                break
            if state.in_flight > 0:
                self._touch(state, now)  # alive (a turn waits or runs): it must not stop the others' expiry
                continue
            self._leave_working_set(state)

    def let_go(self, program_id: str) -> None:
        """The policy decided not to keep the program's KV while it is out on a tool call: it
        leaves the working set until its next turn is admitted (unless a turn of it is in flight)."""
        state = self._programs.get(program_id)
        if state is not None and state.in_flight == 0:
            self._leave_working_set(state)

    def drain_forgotten(self) -> list[ProgramState]:
        out, self._forgotten = self._forgotten, []
        return out

    # -- integrity -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        assert len(self._programs) <= self.max_programs, "registry over its bound"
        seen = [s.last_seen for s in self._programs.values()]
        assert all(a <= b for a, b in zip(seen, seen[1:])), "registry not in last-seen order"
        for pid, s in self._programs.items():
            assert pid == s.program_id, "state filed under another program"
            assert s.in_flight >= 0 and s.turns_finished <= s.turns_arrived, f"turn counts of {pid}"
            assert s.turns_admitted <= s.turns_arrived, f"admitted more turns than arrived: {pid}"
        assert all(pid in self._programs for pid in self._working), "working set names a forgotten program"
        total = sum(self._programs[pid].context_tokens for pid in self._working)
        assert total == self.working_set_tokens, "working-set token sum"
        assert self._final_sum == sum(self._final_contexts), "final-context sum"
        expected = self.expected_final_context
        reserved = sum(max(self._programs[pid].context_tokens, expected) for pid in self._working)
        assert self.reserved_tokens() == reserved, "reserved tokens out of date"

    # -- internals -----------------------------------------------------------------------
    def _touch(self, state: ProgramState, now: float) -> None:
        state.last_seen = max(state.last_seen, now)
        self._programs.move_to_end(state.program_id)
        if state.program_id in self._working:
            self._working.move_to_end(state.program_id)

    def _count_short(self, tokens: int, sign: int) -> None:
        short = self._short
        if short is not None and tokens < short[0]:
            short[1] += sign
            short[2] += sign * tokens

    def _set_context(self, state: ProgramState, tokens: int) -> None:
        if state.program_id in self._working:
            self.working_set_tokens += tokens - state.context_tokens
            self._count_short(state.context_tokens, -1)
            self._working.move_to_end(state.program_id)
        else:
            self.working_set_tokens += tokens
            self._working[state.program_id] = None
        self._count_short(tokens, +1)
        state.context_tokens = tokens

    def _leave_working_set(self, state: ProgramState) -> None:
        if self._working.pop(state.program_id, 0) is None:
            self.working_set_tokens -= state.context_tokens
            self._count_short(state.context_tokens, -1)

    def _record_final_context(self, state: ProgramState) -> None:
        if state.context_tokens <= 0:
            return  # never admitted: says nothing about how far programs grow
        if len(self._final_contexts) == self._final_contexts.maxlen:
            self._final_sum -= self._final_contexts[0]
        self._final_contexts.append(state.context_tokens)
        self._final_sum += state.context_tokens

    def _drop(self, state: ProgramState) -> None:
        self._leave_working_set(state)
        self._record_final_context(state)
        self._forgotten.append(state)
        self.forgotten += 1
