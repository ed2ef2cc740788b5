"""The door: when a new program's first turn may start (program-level admission control), and the
working set it weighs.

**The working set** is the context tokens of programs admitted at least once and seen within
``window_s`` (longer with a host tier, where a program's KV waits out a tool call unpinned): the
programs the pool should hold for their next turn. Each counts at least at the expected final
context, the mean context of the programs that ended lately (not a single request under an id of
its own whose client announces no ends: it teaches nothing of how agents grow; nor a program the
registry's bound dropped): agent contexts grow, so a first turn is a fraction of what its program
will need. A program whose KV the policy keeps nothing of while
it is out on a tool leaves at once (``kept_nothing``), unless a host tier keeps it.

**The door** holds a first turn while the capacity cannot hold the working set plus the turn's own
reservation, at most ``max_hold_s`` (``residency.py``: past it the turn is due and goes first). An
overdue first turn waits for room like any other (bounded waiting orders the queue; it does not
open the door, and an open door is how the wave that thrashes the pool gets in), but it waits first: while an overdue first turn is held, the first turns behind it wait too, so that
smaller new programs cannot take, one after another, the room it waits for. Later turns,
continuations found by prefix and requests without a program id are never held
(``priority.door_exempt``), and the adapter never holds a turn when holding it would idle the
engine. The queue order puts first turns last (``priority.py``): once one is held, not even the
shortest first turn waiting would fit (``over_capacity``) and no turn the door never holds waits
behind it, every turn behind it would be held too, and the adapter ends its walk of the queue
there: a step costs the same however many first turns wait.

The capacity is the adapter's: the device pool, or with HiCache what the two tiers hold together.
Past that, letting more programs in only makes the host tier cycle (every return a re-prefill);
holding whole programs at the door keeps the ones admitted served, where a re-prefill is dear
(with a host tier, only while growth is reserved: ``Residency.holds_first_turns``).

**Residency** (no host tier), the pins that keep admitted programs through their tool calls, the
returns paused at their turn boundary and the bound on every hold, is one decision of its own
(``residency.py``): the door reads it, and holds no turn that has come due.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from sglang_continuum.core.priority import door_exempt
from sglang_continuum.core.programs import ProgramState, RegistryWatcher
from sglang_continuum.core.turns import TurnTag

if TYPE_CHECKING:
    from sglang_continuum.core.residency import Residency

WORKING_SET_WINDOW_S = 30.0  # a program unseen this long (out on a tool) leaves the working set
# ... with a host tier, where a program out on a tool keeps its KV without a pin: long enough for
# most tool calls to come back (recorded Claude Code: p90 66 s), short enough that sessions gone
# for minutes do not keep new ones out
HOST_TIER_WORKING_SET_WINDOW_S = 120.0
FINAL_CONTEXT_WINDOW = 64  # ended programs whose final contexts give the expected one
# an ended program teaches how far programs grow only if it ran this many turns, or its client
# announced its end: a single request under an id of its own (a per-request session id or routing
# key, from a client that knows nothing of programs) is no agent program, and a client sending
# them must not pull every program's growth reservation down
FINAL_CONTEXT_MIN_TURNS = 2


class WorkingSet(RegistryWatcher):
    """Kept up to date by the program registry's notices (``RegistryWatcher``)."""

    def __init__(
        self, *, window_s: float = WORKING_SET_WINDOW_S, final_context_window: int = FINAL_CONTEXT_WINDOW
    ) -> None:
        self.window_s = window_s
        self._working: OrderedDict[str, ProgramState] = OrderedDict()  # least recently seen first
        self.tokens = 0
        # the contexts programs had when they ended or were forgotten: how far a program grows
        self._final_contexts: deque[int] = deque(maxlen=final_context_window)
        self._final_sum = 0
        # working programs below the expected final context E: [E, count, tokens], kept up to date on
        # every context change and rebuilt (O(working set)) only when E moves, i.e. when a program ends
        self._short: Optional[list[int]] = None
        self.reserve_growth = True  # count each program at least at the expected final context
        self.pinned: Callable[[str], bool] = lambda program_id: False  # its pin still keeps its room

    def __len__(self) -> int:
        return len(self._working)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._working

    def items(self) -> Iterator[tuple[str, ProgramState]]:
        return iter(self._working.items())

    @property
    def expected_final_context(self) -> int:
        """The mean context of the last programs that ended (0 before any did)."""
        n = len(self._final_contexts)
        return self._final_sum // n if n else 0

    @property
    def floor(self) -> int:
        """What each program counts at least: the expected final context while growth is reserved."""
        return self.expected_final_context if self.reserve_growth else 0

    def reserved_tokens(self) -> int:
        """What the working set will need: each program in it at least the ``floor``,
        ``sum(max(context, E))`` = today's tokens plus the shortfall of those below E (O(1); O(working
        set) once after E moved)."""
        expected = self.floor
        if self._short is None or self._short[0] != expected:
            below = [c for s in self._working.values() if (c := s.context_tokens) < expected]
            self._short = [expected, len(below), sum(below)]
        _, count, tokens = self._short
        return self.tokens + expected * count - tokens

    def reservation_added(self, program_id: str, context_tokens: int, floor: int) -> int:
        """How much a reservation of ``sum(max(context, floor))`` grows once a turn of
        ``program_id`` with ``context_tokens`` is admitted (a program out of the working set comes
        back into it whole)."""
        new = max(context_tokens, floor)
        state = self._working.get(program_id)
        return new if state is None else max(0, new - max(state.context_tokens, floor))

    def let_go(self, state: Optional[ProgramState]) -> None:
        """The policy keeps none of the program's KV while it is out on a tool call: it leaves the
        working set until its next turn is admitted (unless a turn of it is in flight)."""
        if state is not None and state.in_flight == 0:
            self._leave(state)

    # -- what the registry tells (``RegistryWatcher``) ----------------------------------------
    def seen(self, state: ProgramState) -> None:
        if state.program_id in self._working:
            self._working.move_to_end(state.program_id)

    def context_changed(self, state: ProgramState, tokens: int) -> None:
        if state.program_id in self._working:
            self.tokens += tokens - state.context_tokens
            self._count_short(state.context_tokens, -1)
            self._working.move_to_end(state.program_id)
        else:
            self.tokens += tokens
            self._working[state.program_id] = state
        self._count_short(tokens, +1)

    def forgotten(self, state: ProgramState, *, learn: bool = True) -> None:
        self._leave(state)
        single = state.turns_finished < FINAL_CONTEXT_MIN_TURNS and not state.announces_end
        if not learn or state.context_tokens <= 0 or single:
            return  # never admitted, or a single request: says nothing about how far programs grow
        if len(self._final_contexts) == self._final_contexts.maxlen:
            self._final_sum -= self._final_contexts[0]
        self._final_contexts.append(state.context_tokens)
        self._final_sum += state.context_tokens

    def expire(self, now: float, touch: Callable[[ProgramState, float], None]) -> None:
        """Programs unseen for ``window_s`` leave; one with a turn in flight is alive, whatever its
        last event (``touch``: seen now), and must not stop the others' expiry; one whose pin still
        holds its room stays (a pin may outlast the window) and is looked at again a window later."""
        cutoff = now - self.window_s
        for _ in range(len(self._working)):  # each program at most once: pinned ones go to the back
            state = next(iter(self._working.values()))
            if state.last_seen > cutoff:
                break
            if state.in_flight > 0:
                touch(state, now)
            elif self.pinned(state.program_id):
                self._working.move_to_end(state.program_id)
            else:
                self._leave(state)

    def check_integrity(self) -> None:
        assert sum(s.context_tokens for s in self._working.values()) == self.tokens, "working-set token sum"
        assert self._final_sum == sum(self._final_contexts), "final-context sum"
        expected = self.floor
        reserved = sum(max(s.context_tokens, expected) for s in self._working.values())
        assert self.reserved_tokens() == reserved, "reserved tokens out of date"

    # -- internals -----------------------------------------------------------------------
    def _count_short(self, tokens: int, sign: int) -> None:
        short = self._short
        if short is not None and tokens < short[0]:
            short[1] += sign
            short[2] += sign * tokens

    def _leave(self, state: ProgramState) -> None:
        if self._working.pop(state.program_id, None) is not None:
            self.tokens -= state.context_tokens
            self._count_short(state.context_tokens, -1)


class Door:
    def __init__(self, enabled: bool, residency: "Residency") -> None:
        """``residency``: the pins, pauses and hold bound the door reads (``residency.py``)."""
        self.enabled = enabled
        self.residency = residency
        self.working_set = residency.working_set

    def use_host_tier(self) -> None:
        self.residency.use_host_tier()

    def kept_nothing(self, state: Optional[ProgramState]) -> None:
        """The policy keeps none of the program's KV through its tool call (no pin, or its pin ended):
        no room is kept for it, unless a host tier keeps the KV while it is seen."""
        if not self.residency.host_tier:
            self.working_set.let_go(state)

    def weighs(self, tag: TurnTag, state: Optional[ProgramState]) -> bool:
        """Whether the door weighs ``tag``'s turn at all: a first turn (``Residency.holds_first_turns``),
        or a paused return (``Residency.pauses``), not yet due."""
        if not self.enabled or state is None or door_exempt(tag) or tag.due:
            return False
        if state.turns_admitted == 0:
            return self.residency.holds_first_turns()
        return self.residency.pauses(tag, state)

    def holds_back(
        self,
        tag: TurnTag,
        state: Optional[ProgramState],
        request_tokens: int,
        capacity_tokens: int,
        *,
        idle: bool = False,
        pending_tokens: int = 0,
        behind_overdue: bool = False,
        now: float = 0.0,
    ) -> bool:
        """Whether ``tag``'s turn (of the program ``state``, None: ended) waits (a pure read); ``idle``:
        nothing else would run if it did; ``pending_tokens``: what turns admitted earlier in the same
        prefill selection reserve (the working set learns of them only once the batch is formed;
        without them every first turn of a selection would see the same room, and a wave of new
        programs would pass together); ``behind_overdue``: an overdue first turn ahead of it is held."""
        if idle or not self.weighs(tag, state):
            return False
        if behind_overdue:
            return True
        if len(self.working_set) == 0 and pending_tokens == 0:
            return False
        return self.over_capacity(request_tokens, capacity_tokens, pending_tokens)

    def over_capacity(self, request_tokens: int, capacity_tokens: int, pending_tokens: int = 0) -> bool:
        """Whether a turn of ``request_tokens`` would overfill ``capacity_tokens`` beside the working
        set's reservation and ``pending_tokens``: ``holds_back``'s room check."""
        working = self.working_set
        return working.reserved_tokens() + max(request_tokens, working.floor) + pending_tokens > capacity_tokens

    def reservation(self, tag: TurnTag, request_tokens: int) -> int:
        """What admitting ``tag``'s turn adds to the working set's reservation (0 for a request
        without a program, or with the door off)."""
        if not self.enabled or not tag.meta.has_program:
            return 0
        floor = self.working_set.floor
        return self.working_set.reservation_added(tag.meta.program_id, request_tokens, floor)

    def check_integrity(self) -> None:
        self.working_set.check_integrity()
        self.residency.check_integrity()
