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
reservation. An overdue first turn waits for room like any other (bounded waiting orders the
queue; it does not open the door, and an open door is how the wave that thrashes the pool gets in),
but it waits first: while an overdue first turn is held, the first turns behind it wait too, so that
smaller new programs cannot take, one after another, the room it waits for. Later turns,
continuations found by prefix and requests without a program id are never held
(``priority.door_exempt``), and the adapter never holds a turn when holding it would idle the
engine. The queue order puts first turns last (``priority.py``): once one is held, not even the
shortest first turn waiting would fit (``over_capacity``) and no turn the door never holds waits
behind it, every turn behind it would be held too, and the adapter ends its walk of the queue
there: a step costs the same however many first turns wait.

The capacity is the adapter's: the device pool, or with HiCache what the two tiers hold together.
Past that, letting more programs in only makes the host tier cycle (every return a re-prefill);
holding whole programs at the door keeps the ones admitted served.

**Residency** (no host tier): the door and the pin are one decision. While the door is *binding*
(it held a first turn within ``BINDING_S``), the memory an admitted program keeps through its tool
call is memory the door would give nobody: what keeping it costs is the engine's, a place in the
batch left empty (worth the decode it would have batched: ``engine_time.py`` learns the decode
share of the engine's time from the scheduler's steps), against the re-prefill its release would
cost (``keeping_pays``, priced by the TTL model's rebuild cost: the prefill profile, times the
share of their context the programs let go unpinned at their turn's end found gone when they came
back: a context let go is only lost if the pool gives its room to others before the program is
back). Where keeping pays, the program stays resident, pinned for the tool's usual time whatever
the TTL model would pay. The same price decides whether
the working set reserves room for programs to grow to the expected final context: where a
re-prefill is cheap beside a larger batch (a decode-bound engine), it reserves only what they hold.
And a return
that found its context gone, from a program no longer in the working set, is a program the pool
could not keep: it is *paused* at its turn boundary -- held like a first turn until the working set
leaves it room, then resumed in the queue order -- rather than re-prefilled into a pool where it
evicts the resident ones (the thrash of an over-admitted pool, or of a cold start before any
program has ended). No running turn is preempted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Callable, Iterator, Optional

from sglang_continuum.core.engine_time import EngineTime
from sglang_continuum.core.priority import door_exempt
from sglang_continuum.core.programs import ProgramState, RegistryWatcher
from sglang_continuum.core.return_loss import ReturnLossMeter
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.turns import TurnTag

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
BINDING_S = 5.0  # the door binds for this long after it held a first turn
RESIDENT_QUANTILE = 0.9  # a resident program's pin lasts this quantile of its tool's times
RESIDENT_MIN_SAMPLES = 8  # ... known from this many of them (else from every tool's)
# resident programs' pins may fill this share of the pool (the door keeps their room), beyond the
# pin budget (``pin_budget_fraction``) that other pins keep to; the rest is the running turns' room
# to prefill and grow (at 90%, 96 Claude Code sessions' running turns shed a resident pin for
# admission about once every seven turns)
RESIDENT_PIN_SHARE = 0.7


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
        last event (``touch``: seen now), and must not stop the others' expiry."""
        cutoff = now - self.window_s
        while self._working:
            state = next(iter(self._working.values()))
            if state.last_seen > cutoff:
                break
            if state.in_flight > 0:
                touch(state, now)
                continue
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


def _quantile(window, q: float) -> float:
    ordered = window.sorted
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


class Door:
    def __init__(
        self, enabled: bool, stats: Optional[ToolStats] = None, rebuild_s: Optional[Callable[[int], float]] = None
    ) -> None:
        """``stats``: the tools' times, which say how long a resident program is kept;
        ``rebuild_s``: seconds of engine time to rebuild a context of so many tokens (the TTL
        model's), which prices keeping it (None: no price, keeping never pays)."""
        self.enabled = enabled
        self.stats = stats
        self.rebuild_s = rebuild_s
        self.working_set = WorkingSet()
        self.host_tier = False
        self.binding_until = -1.0  # the door held a first turn lately (``BINDING_S``)
        self.capacity_tokens = 0  # the capacity the adapter last weighed a turn against
        self.engine = EngineTime()  # the decode share of the engine's time, which prices a batch place
        # what a context let go loses: what of their context the programs let go at their turn's end
        # (no pin) found gone on arrival (not those whose pin ended partway: they were kept part of
        # the gap and would price a release too low)
        self.let_go_loss = ReturnLossMeter()
        self._growth_priced_at: Optional[tuple] = None  # the inputs of the last growth price

    def binding(self, now: float) -> bool:
        return now <= self.binding_until

    def slots(self) -> float:
        """``K``: how many programs the pool holds at the expected final context (the programs in
        the working set before any program has ended)."""
        expected = self.working_set.expected_final_context
        if expected > 0 and self.capacity_tokens > 0:
            return max(1.0, self.capacity_tokens / expected)
        return float(max(1, len(self.working_set)))

    def release_loss(self) -> float:
        """The share of a context let go that its return will find gone: measured on the programs
        let go at their turn's end (1 until enough of them are seen: every release priced as lost)."""
        meter = self.let_go_loss
        return meter.ratio if meter.ready else 1.0

    def let_go_returned(self, previous_tokens: int, cached_tokens: int) -> None:
        """A program let go at its turn's end came back: its context was ``previous_tokens`` when
        that turn ended, and ``cached_tokens`` of it were found cached on arrival."""
        self.let_go_loss.observe(previous_tokens, cached_tokens)

    def keeping_pays(self, context_tokens: int, hold_s: float, lost: float = 1.0) -> bool:
        """Whether keeping ``context_tokens`` of a program out on a tool for ``hold_s`` is worth
        the engine's time. Kept, its room is a place in the batch nobody takes: for ``hold_s`` the
        engine runs one program fewer of the ``K`` the pool holds (``slots``), which costs the
        decode it would have batched, about ``hold_s / K`` of the engine's decode time (``hold_s *
        decode_share / K``: a prefill runs no faster in a larger batch). Let go, its return
        re-prefills the ``lost`` share of the context (where the pool gave its room to others),
        ``rebuild_s`` of engine time in which none of the ``K`` decodes.
        Keep iff ``lost * rebuild_s * K >= hold_s * decode_share``: on a prefill-bound engine (long
        contexts, cheap decode steps or short answers) nearly always; on a decode-bound one, where
        a re-prefill is cheap beside a larger batch, rarely."""
        if self.rebuild_s is None:
            return False
        return lost * self.rebuild_s(context_tokens) * self.slots() >= hold_s * self.engine.decode_share

    def resident_ttl(self, tool: str, now: float, context_tokens: int) -> float:
        """How long to keep a program resident through ``tool`` while the door binds (0: it does
        not, or keeping does not pay): the tool's usual time. It is priced at the room the door
        keeps for it, at least the expected final context while growth is reserved: a program let
        go young is rebuilt on its later returns at the size it grows to; and at the share of a
        context let go that returns find gone (``release_loss``): where the pool keeps unpinned
        contexts until their programs are back, a pin keeps the room from new programs for nothing."""
        if not self.enabled or self.host_tier or self.stats is None or not self.binding(now):
            return 0.0
        window, _ = self.stats.window_for(tool, min_samples=RESIDENT_MIN_SAMPLES)
        if len(window) == 0:
            return 0.0
        tau = _quantile(window, RESIDENT_QUANTILE)
        size = max(context_tokens, self.working_set.floor)  # the room the door keeps for it
        return tau if self.keeping_pays(size, tau, self.release_loss()) else 0.0

    def _price_growth(self) -> None:
        """Reserve room for growth unless the engine says a lost context is cheap: the room a
        program will grow into, kept through the tools' usual time, against rebuilding a context
        of that size (no host tier; with one, or before tools and ends are seen, growth is
        reserved)."""
        working, stats = self.working_set, self.stats
        expected = working.expected_final_context
        if self.host_tier or stats is None or expected == 0 or len(stats.global_samples) < RESIDENT_MIN_SAMPLES:
            working.reserve_growth, self._growth_priced_at = True, None
            return
        # asked per held turn per step: priced again only when an input moves
        key = (stats.global_samples.version, expected, self.capacity_tokens, round(self.engine.decode_share, 2))
        if key != self._growth_priced_at:
            self._growth_priced_at = key
            tau = _quantile(stats.global_samples, RESIDENT_QUANTILE)
            working.reserve_growth = self.keeping_pays(expected, tau)

    def pauses(self, tag: TurnTag, state: Optional[ProgramState]) -> bool:
        """A return that found its context gone, from a program out of the working set: paused
        while the working set leaves it no room (no host tier: there, its KV waits on host)."""
        return (
            not self.host_tier
            and state is not None
            and tag.context_gone
            and state.in_flight <= 1
            and state.program_id not in self.working_set
        )

    def use_host_tier(self) -> None:
        """A program out on a tool keeps its KV on host, pinned or not: its room is kept longer."""
        self.host_tier = True
        self.working_set.window_s = HOST_TIER_WORKING_SET_WINDOW_S

    def kept_nothing(self, state: Optional[ProgramState]) -> None:
        """The policy keeps none of the program's KV through its tool call (no pin, or its pin ended):
        no room is kept for it, unless a host tier keeps the KV while it is seen."""
        if not self.host_tier:
            self.working_set.let_go(state)

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
        """Whether ``tag``'s turn (of the program ``state``, None: ended) waits; ``idle``: nothing else
        would run if it did; ``pending_tokens``: what turns admitted earlier in the same prefill
        selection reserve (the working set learns of them only once the batch is formed; without
        them every first turn of a selection would see the same room, and a wave of new programs
        would pass together); ``behind_overdue``: an overdue first turn ahead of it is held.
        A paused return (``pauses``) is weighed as a first turn is."""
        if not self.enabled or idle or door_exempt(tag):
            return False
        if state is None:
            return False
        first_turn = state.turns_admitted == 0
        if not first_turn and not self.pauses(tag, state):
            return False
        if behind_overdue:
            return True
        working = self.working_set
        if len(working) == 0 and pending_tokens == 0:
            return False
        self.capacity_tokens = capacity_tokens
        self._price_growth()
        held = self.over_capacity(request_tokens, capacity_tokens, pending_tokens)
        if held and first_turn:
            self.binding_until = now + BINDING_S
        return held

    def over_capacity(self, request_tokens: int, capacity_tokens: int, pending_tokens: int = 0) -> bool:
        """Whether a turn of ``request_tokens`` would overfill ``capacity_tokens`` beside the working
        set's reservation and ``pending_tokens``: ``holds_back``'s room check, read on the state the
        door last priced (a pure read)."""
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
        self.engine.check_integrity()
        self.let_go_loss.check_integrity()
