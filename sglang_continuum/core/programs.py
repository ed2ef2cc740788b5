"""Program registry: what the policy remembers about each agent program, bounded in size.

A program is forgotten when its last step is served, when it has been idle longer than
``idle_timeout_s`` (a client that vanished), or when the registry is full and a new id arrives.
Every forgotten program is handed back to the owner (``drain_forgotten``) so that nothing it held
(a pin, a host pin) outlives it.

The bound is a cache under a scan any client can send (distinct ids, one request each), so what
it drops is chosen like a segmented LRU's: first the least recently seen program that never came
back from a tool (``probation``; a flood of one-turn ids churns only these), then any other; never
one with a turn in flight, nor one the owner says holds memory (``holds_memory``: a pin, whose
program is expected back). A program passed over is alive and counts as seen now. Each new id
looks at no more than ``OVERFLOW_SCAN`` programs per segment; when none of them may go, the new id
is refused (``turn_arrived`` returns no state) and its turn is served as one without a program id,
until room frees.

What it sees of each program's context it tells a ``RegistryWatcher`` (the door's working set,
``core/door.py``), which keeps its own sums from those notices and never writes a program's state.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

MAX_PROGRAMS = 100_000
PROGRAM_IDLE_TIMEOUT_S = 900.0  # a program unseen this long, with nothing in flight, is forgotten
OVERFLOW_SCAN = 8  # programs a new id past the bound looks at, per segment, for one it may drop


def affine_slot(program_id: str, slots: int) -> int:
    """A stable slot in ``range(slots)`` for a program (the same in every process and run, unlike
    ``hash``): how turns of one program keep reaching the same data-parallel rank."""
    if slots < 1:
        raise ValueError("slots must be >= 1")
    digest = hashlib.blake2b(program_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % slots


# what became of a finished turn's pin (``ProgramState.pin_end``, set by ``pinning.py``): the
# event log's records say it for each returning turn, so a benchmark can tell why a context was lost
PIN_KEPT = "pinned"  # still pinned, or held until its program's turn came back (a hit)
PIN_NONE = "none"  # no pin: the TTL model paid for none and the door did not keep the program resident
PIN_REFUSED = "refused"  # the pins' budget, held by earlier programs, had no room for it
PIN_EXPIRED = "expired"  # its TTL ran out before the program came back
PIN_RELEASED = "released"  # dropped with its turn retracted or its program aborted
PIN_FLUSHED = "flushed"  # the engine dropped its whole cache
PIN_SHED = "shed-"  # + the shed's reason (``ShedCounters``): given back under memory or budget pressure


@dataclass(slots=True)
class ProgramState:
    program_id: str
    arrival_rank: int  # program-level FCFS rank: the arrival order of its first turn (scoped ids: ``scopes.py``)
    last_seen: float
    turns_arrived: int = 0
    turns_admitted: int = 0
    turns_finished: int = 0
    in_flight: int = 0
    last_finish: Optional[float] = None
    pending_tool: Optional[str] = None  # tool called by the last finished turn, not yet returned
    tool_hint_s: Optional[float] = None  # the client's forecast of that call's duration
    app_id: Optional[str] = None  # the multi-agent application it belongs to (a client hint)
    scope: Optional[str] = None  # its sender's scope (``metadata.SCOPE_KEY``): its pins' share (``pins.py``)
    critical: bool = False  # on that application's critical path (a client hint, its latest turn's)
    context_tokens: int = 0  # its context as of its latest admitted or finished turn
    first_step: Optional[int] = None  # the client's step number of the first turn seen here
    pin_shed: bool = False  # its last pin was shed (not expired, not hit) and it has not come back yet
    pin_end: str = ""  # what became of its last finished turn's pin (``PIN_*``; "" before any turn finished)
    pin_lost_waiting: bool = False  # its pin was shed or expired while its next turn waited: that turn missed
    announces_end: bool = False  # its client flags the last step (else its end is presumed from silence)
    longest_gap: float = 0.0  # the longest it has been away on a tool call and come back
    gaps: int = 0  # tool calls it came back from
    # its later turns' prompts, and what of them was found cached at admission (the live view's
    # cached share, ``snapshot.py``): two additions per admission
    later_prompt_tokens: int = 0
    later_cached_tokens: int = 0

    @property
    def let_go(self) -> bool:
        """Its last finished turn was not pinned: its context was unprotected all through its gap."""
        return self.pin_end in (PIN_NONE, PIN_REFUSED)


@dataclass(frozen=True, slots=True)
class ToolReturn:
    """A program came back from a tool call: ``seconds`` between the previous turn's finish and
    this turn's arrival, attributed to ``tool``."""

    program_id: str
    tool: str
    seconds: float


class RegistryWatcher:
    """What the registry tells about its programs, in the order it happens (no-ops here)."""

    def seen(self, state: ProgramState) -> None:
        """``state`` was seen (any event)."""

    def context_changed(self, state: ProgramState, tokens: int) -> None:
        """``state``'s context becomes ``tokens`` (told before ``state.context_tokens`` changes)."""

    def went_out(self, state: ProgramState, now: float) -> None:
        """A turn of ``state`` finished: it is out on ``state.pending_tool`` (unless a turn is in flight)."""

    def forgotten(self, state: ProgramState, *, learn: bool = True) -> None:
        """``state`` left the registry (ended, idle, or overflow); ``learn``: it was a program (not a
        single-shot request taken for one), whose final context says how far programs grow."""

    def expire(self, now: float, touch: Callable[[ProgramState, float], None]) -> None:
        """Once per step, after idle programs were dropped; ``touch`` marks a program seen now."""


class ProgramRegistry:
    def __init__(
        self,
        *,
        max_programs: int = MAX_PROGRAMS,
        idle_timeout_s: float = PROGRAM_IDLE_TIMEOUT_S,
        watcher: Optional[RegistryWatcher] = None,
        holds_memory: Callable[[ProgramState], bool] = lambda state: False,
    ) -> None:
        if max_programs < 1:
            raise ValueError("max_programs must be >= 1")
        self.max_programs = max_programs
        self.idle_timeout_s = idle_timeout_s
        self.watcher = watcher if watcher is not None else RegistryWatcher()
        self._holds_memory = holds_memory
        self._programs: OrderedDict[str, ProgramState] = OrderedDict()  # least recently seen first
        # the programs that never came back from a tool call, least recently seen first: what the
        # bound drops first
        self._probation: OrderedDict[str, None] = OrderedDict()
        self.refused = 0  # new ids turned away: the registry full of programs it may not drop
        self._forgotten: list[ProgramState] = []  # dropped by overflow or idleness, not yet drained
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._programs

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self._programs.values())

    def get(self, program_id: str) -> Optional[ProgramState]:
        return self._programs.get(program_id)

    def recent(self) -> Iterator[ProgramState]:
        """The programs, most recently seen first."""
        return reversed(self._programs.values())

    # -- events --------------------------------------------------------------------------
    def turn_arrived(
        self, program_id: str, now: float, rank: int
    ) -> tuple[Optional[ProgramState], Optional[ToolReturn]]:
        """Record a turn's arrival; ``rank`` (a global arrival counter) becomes the program's
        arrival rank if this is its first turn. No state: a new id the full registry refused."""
        state = self._programs.get(program_id)
        if state is None:
            if len(self._programs) >= self.max_programs and not self._make_room(now):
                self.refused += 1
                return None, None
            state = ProgramState(program_id, arrival_rank=rank, last_seen=now)
            self._programs[program_id] = state
            self._probation[program_id] = None
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
            self._probation.pop(program_id, None)
        return state, ret

    def turn_admitted(
        self, program_id: str, now: float, context_tokens: int, cached_tokens: Optional[int] = None
    ) -> Optional[ProgramState]:
        """``cached_tokens``: of the turn's ``context_tokens`` (its prompt), found cached (None: not known)."""
        state = self._programs.get(program_id)
        if state is not None:
            state.turns_admitted += 1
            if state.turns_admitted > 1 and cached_tokens is not None:
                state.later_prompt_tokens += context_tokens
                state.later_cached_tokens += cached_tokens
            self._touch(state, now)
            self._set_context(state, context_tokens)
        return state

    def turn_finished(
        self, program_id: str, now: float, tool: Optional[str], context_tokens: int, hint_s: Optional[float] = None
    ) -> Optional[ProgramState]:
        """None for a straggler: a turn of a program already ended or forgotten (it must not
        bring the program back with a new rank). ``hint_s``: the client's forecast of the tool call."""
        state = self._programs.get(program_id)
        if state is None:
            return None
        self._touch(state, now)
        state.turns_finished += 1
        state.in_flight = max(0, state.in_flight - 1)
        state.last_finish = now
        state.pending_tool, state.tool_hint_s = tool, hint_s
        if context_tokens > 0:
            self._set_context(state, context_tokens)
        self.watcher.went_out(state, now)
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
            self._probation.pop(program_id, None)
            self.watcher.forgotten(state, learn=learn)
        return state

    def forget_idle(self, now: float) -> None:
        """Drop programs unseen for ``idle_timeout_s`` that have no turn in flight (to
        ``drain_forgotten``), then let the watcher expire what it keeps; O(number dropped or
        refreshed)."""
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
            self._probation.pop(state.program_id, None)
            self._drop(state)
        self.watcher.expire(now, self._touch)

    def drain_forgotten(self) -> list[ProgramState]:
        out, self._forgotten = self._forgotten, []
        return out

    # -- integrity -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        assert len(self._programs) <= self.max_programs, "registry over its bound"
        assert all(pid in self._programs for pid in self._probation), "a forgotten program on probation"
        for pid, s in self._programs.items():
            assert (pid in self._probation) == (s.gaps == 0), f"{pid} on probation: {pid in self._probation}"
        seen = [s.last_seen for s in self._programs.values()]
        assert all(a <= b for a, b in zip(seen, seen[1:])), "registry not in last-seen order"
        for pid, s in self._programs.items():
            assert pid == s.program_id, "state filed under another program"
            assert s.in_flight >= 0 and s.turns_finished <= s.turns_arrived, f"turn counts of {pid}"
            assert s.turns_admitted <= s.turns_arrived, f"admitted more turns than arrived: {pid}"

    # -- internals -----------------------------------------------------------------------
    def _make_room(self, now: float) -> bool:
        """Drop one program a new id may take the place of (module docstring); False: none found."""
        for segment in (self._probation, self._programs):
            for _ in range(min(OVERFLOW_SCAN, len(segment))):
                state = self._programs[next(iter(segment))]
                if state.in_flight == 0 and not self._holds_memory(state):
                    del self._programs[state.program_id]
                    self._probation.pop(state.program_id, None)
                    self._drop(state, learn=False)  # made room for another: not an end
                    return True
                self._touch(state, now)  # alive: passed over, and the next look starts past it
        return False

    def _touch(self, state: ProgramState, now: float) -> None:
        state.last_seen = max(state.last_seen, now)
        self._programs.move_to_end(state.program_id)
        if state.program_id in self._probation:
            self._probation.move_to_end(state.program_id)
        self.watcher.seen(state)

    def _set_context(self, state: ProgramState, tokens: int) -> None:
        self.watcher.context_changed(state, tokens)
        state.context_tokens = tokens

    def _drop(self, state: ProgramState, *, learn: bool = True) -> None:
        self.watcher.forgotten(state, learn=learn)
        self._forgotten.append(state)
        self.forgotten += 1
