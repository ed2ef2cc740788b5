"""Residency (no host tier): which admitted programs the pool keeps through their tool calls, which
returns wait at their turn boundary, and how long any turn waits at the door. One decision, priced
by one model and stepped once per scheduler iteration (``step``); the door (``door.py``) and the
pins (``pinning.py``) only read it.

**Keeping pays** (``keeping_pays``). While the door is *binding* (a turn it held waits, due or not;
the admitted programs overfill the pool; or it held a first turn within ``BINDING_S``), the memory
an admitted program keeps through its tool call is memory the door would give nobody. Kept for
``hold`` seconds, its room is a place in the batch nobody takes: the engine runs one program fewer
of the ``K`` the pool holds (``slots``), about ``hold * d / K`` of its time (``d``: the decode
share, ``engine_time.py``; a prefill runs no faster in a larger batch). Let go, its return
re-prefills the share ``L`` of its context that the pool gave to others before it was back
(``release_loss``), ``rebuild_s`` of engine time in which none of the ``K`` decodes; kept, it saves
that only if it is back within the hold (``P(T <= hold)``, its tool's times and return
probability). Keep iff ``P * L * rebuild * K >= hold * d``.

- **The resident hold** is the pin it will really get: the tool's usual time (p90) capped at
  ``max_ttl_s``, priced at the room the door keeps for it (at least the expected final context
  while growth is reserved: a program let go young is rebuilt at the size it grows to).
- **Growth** (``WorkingSet.reserve_growth``): the working set counts each program at the expected
  final context only while keeping a context of that size through the tools' usual time pays, a
  release priced as lost (``_price_growth``), with a host tier or without.
- **First turns** (``holds_first_turns``): without a host tier the door's capacity is the device
  pool, and past it SGLang retracts running turns whatever a rebuild costs: the door always weighs
  a first turn. With one, the capacity is both tiers', and past it the host tier cycles: returns
  re-prefill, which is worth a new program's wait only where keeping a context pays (growth
  reserved). Where rebuilds are cheap the door is open (the CPU server: a 300-token context
  rebuilds in 20 ms).
- **Pausing** (``pauses``): a return that found its context gone, from a program out of the working
  set, waits at its turn boundary only while a lost context is dear (growth is reserved) and what
  it lost is worth more rebuilt than the batch place its wait leaves (``keeping_pays`` on the lost
  tokens); otherwise it re-prefills at once.
- **The release loss** is learned from the programs let go at their turn's end (``ReleaseLossMeter``)
  and forgets samples older than a horizon: releases seen while the pool had room do not price
  residency out once it fills (then residency keeps the programs and no release is seen); with
  none seen lately a release is priced as lost, which is what a binding door makes of it.

**Every hold is bounded** (``max_hold_s``; 0: no bound). A turn the door holds (a first turn, a
paused return) comes *due* once it has waited ``max_hold_s`` since it arrived. The door stops
holding it and the queue order puts it ahead of every other turn; blocked for memory, it may shed
the pins that keep residents out on a tool, latest program first (``shedding.py``), and once none
is left those of residents whose next turn already waits (behind the due turn anyway). A program so
released leaves the working set, and its next return is held while the pool is full, whatever it
finds cached, until its own bound (taking turns). No running turn is preempted. What the bound
costs is one rebuild per release (``sglang:continuum_pin_sheds_total{reason="hold_bound"}``); a due turn
waits past its bound only for room to free (running turns to finish).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Optional

from sglang_continuum.core.door import HOST_TIER_WORKING_SET_WINDOW_S, WorkingSet
from sglang_continuum.core.engine_time import EngineTime
from sglang_continuum.core.programs import PIN_SHED, ProgramState
from sglang_continuum.core.return_loss import ReleaseLossMeter
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.turns import TurnTag

# the door binds for this long after it held a first turn: first turns held a few steps apart keep it
# binding (on the emulated H100 a step is 10-100 ms, on the CPU server up to a second)
BINDING_S = 5.0
RESIDENT_QUANTILE = 0.9  # a resident program's pin lasts this quantile of its tool's times: 9 in 10 returns
RESIDENT_MIN_SAMPLES = 8  # ... known from this many of them (else from every tool's): the release meter's own minimum
# resident programs' pins may fill this share of the pool (the door keeps their room), beyond the
# pin budget (``pin_budget_fraction``) that other pins keep to; the rest is the running turns' room
# to prefill and grow (at 90%, 96 Claude Code sessions' running turns shed a resident pin for
# admission about once every seven turns)
RESIDENT_PIN_SHARE = 0.7
HOLDS_REPORTED = 4096  # finished holds kept for the exporter between two of its reads
FIRST_TURN, PAUSE = "first_turn", "pause"  # the two kinds of hold (the histogram's label)
RELEASED_FOR_BOUND = PIN_SHED + "hold_bound"  # a program's pin_end once the bound released it


def _quantile(window, q: float) -> float:
    ordered = window.sorted
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _share_within(window, seconds: float) -> float:
    """The share of ``window``'s samples at most ``seconds``."""
    return float(window.sorted.searchsorted(seconds, "right")) / len(window)


class Holds:
    """The turns the door holds: when each comes due, the longest hold in progress, and the holds
    that ended (admitted) for the histogram. Heaps pruned lazily: a turn that left (admitted,
    aborted) is dropped when it reaches the top."""

    def __init__(self) -> None:
        self._by_due: list[tuple[float, int, TurnTag]] = []
        self._by_start: list[tuple[float, int, TurnTag]] = []
        self.ended: deque[tuple[str, float]] = deque(maxlen=HOLDS_REPORTED)  # (kind, seconds)
        self.came_due = 0  # holds the bound ended (the door let the turn go)
        self.waiting = 0  # turns held and not yet admitted (or aborted), due or not

    def held(self, tag: TurnTag, due_at: Optional[float]) -> None:
        """``tag`` was held for the first time; it comes due at ``due_at`` (None: never)."""
        tag.due_at = due_at
        self.waiting += 1
        heapq.heappush(self._by_start, (tag.queued_at, tag.request_rank, tag))
        if len(self._by_start) > 2 * self.waiting + 64:  # holds that ended behind a long one: drop them
            self._by_start = [e for e in self._by_start if not e[2].hold_ended]
            heapq.heapify(self._by_start)
        if due_at is not None:
            heapq.heappush(self._by_due, (due_at, tag.request_rank, tag))

    def left(self, tag: Optional[TurnTag], now: float, *, admitted: bool) -> None:
        """A turn left the queue; if it was held and admitted, its hold (arrival to admission) is reported."""
        if tag is not None and tag.held_back and not tag.hold_ended:
            tag.hold_ended = True
            self.waiting -= 1
            if admitted:
                self.ended.append((FIRST_TURN if tag.new_program else PAUSE, now - tag.queued_at))

    def due(self, now: float) -> list[TurnTag]:
        """Held turns whose bound passed by ``now``, marked due (each once)."""
        found = []
        while self._by_due and self._by_due[0][0] <= now:
            tag = heapq.heappop(self._by_due)[2]
            if not tag.hold_ended and not tag.due:
                tag.due = True
                self.came_due += 1
                found.append(tag)
        return found

    def longest(self, now: float) -> float:
        """How long the longest-waiting turn the door has held (not yet admitted) has waited."""
        while self._by_start and self._by_start[0][2].hold_ended:
            heapq.heappop(self._by_start)
        return now - self._by_start[0][0] if self._by_start else 0.0

    def check_integrity(self) -> None:
        live = {id(t): t for _, _, t in self._by_start if not t.hold_ended}
        assert self.waiting == len(live), "held turns miscounted"
        assert all(t.held_back for _, _, t in self._by_start), "a turn never held among the holds"
        assert all(t.due_at is not None for _, _, t in self._by_due), "a due entry without a bound"


class Residency:
    def __init__(
        self,
        enabled: bool,
        stats: Optional[ToolStats] = None,
        rebuild_s: Optional[Callable[[int], float]] = None,
        *,
        max_ttl_s: float = 30.0,
        max_hold_s: float = 0.0,
        working_set: Optional[WorkingSet] = None,
    ) -> None:
        """``stats``: the tools' times; ``rebuild_s``: seconds of engine time to rebuild a context of
        so many tokens from nothing (the TTL model's prefill: with a host tier too, since what the
        door and residency keep out is a context lost from both tiers; None: keeping never pays);
        ``max_ttl_s``: the longest pin;
        ``max_hold_s``: the bound on a held turn's wait (0: none)."""
        self.enabled = enabled
        self.stats = stats
        self.rebuild_s = rebuild_s
        self.max_ttl_s = max_ttl_s
        self.max_hold_s = max_hold_s
        self.working_set = working_set if working_set is not None else WorkingSet()
        self.host_tier = False
        self.binding_until = -1.0  # the door held a first turn lately (``BINDING_S``)
        self.capacity_tokens = 0  # the adapter's capacity at the last step
        self.engine = EngineTime()  # the decode share of the engine's time, which prices a batch place
        # what a context let go loses: what the programs let go at their turn's end (no pin) found
        # gone on arrival (not those whose pin ended partway: kept part of the gap, they would
        # price a release too low)
        self.let_go_loss = ReleaseLossMeter()
        self.holds = Holds()
        self._growth_priced_at: Optional[tuple] = None  # the inputs of the last growth price

    # -- once per scheduler iteration ------------------------------------------------------
    def step(self, now: float, capacity_tokens: int) -> list[TurnTag]:
        """Price the step's state (capacity, release loss, growth) and return the held turns that
        came due (their queue keys change)."""
        self.capacity_tokens = capacity_tokens
        self.let_go_loss.expire(now)
        self._price_growth()
        if self.holds.waiting or self.working_set.reserved_tokens() > capacity_tokens > 0:
            # a turn the door held waits for room, due or not, or the programs admitted overfill the
            # pool (turns let in at their bound): what a program lets go is someone else's at once
            self.binding_until = max(self.binding_until, now + BINDING_S)
        return self.holds.due(now)

    # -- events -----------------------------------------------------------------------------
    def held(self, tag: TurnTag, state: ProgramState, now: float) -> None:
        """The door held ``tag``'s turn (of ``state``): a held first turn binds the door; a turn
        held for the first time gets its bound."""
        if state.turns_admitted == 0:
            self.binding_until = now + BINDING_S
        if not tag.held_back:  # its first hold (the controller marks it held after this)
            self.holds.held(tag, tag.queued_at + self.max_hold_s if self.max_hold_s > 0 else None)

    def let_go_returned(self, previous_tokens: int, cached_tokens: int, now: float) -> None:
        """A program let go at its turn's end came back: its context was ``previous_tokens`` when
        that turn ended, and ``cached_tokens`` of it were found cached on arrival."""
        self.let_go_loss.observe(previous_tokens, cached_tokens, now)

    def use_host_tier(self) -> None:
        """A program out on a tool keeps its KV on host, pinned or not: its room is kept longer."""
        self.host_tier = True
        self.working_set.window_s = HOST_TIER_WORKING_SET_WINDOW_S

    # -- pure reads -------------------------------------------------------------------------
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
        """``L``: the share of a context let go that its return finds gone."""
        return self.let_go_loss.ratio

    def keeping_pays(self, context_tokens: int, hold_s: float, saved: float = 1.0) -> bool:
        """Whether keeping ``context_tokens`` out on a tool for ``hold_s`` is worth the engine's time:
        ``saved`` (the share of a rebuild keeping saves: ``P * L``) times the rebuild times ``K``
        against ``hold_s`` times the decode share (the module's docstring)."""
        if self.rebuild_s is None:
            return False
        return saved * self.rebuild_s(context_tokens) * self.slots() >= hold_s * self.engine.decode_share

    def _hold(self, window, tool: Optional[str]) -> tuple[float, float]:
        """The pin a resident program gets (p90 of the window, capped at ``max_ttl_s``) and the
        chance its program is back within it."""
        hold = min(_quantile(window, RESIDENT_QUANTILE), self.max_ttl_s)
        back = self.stats.return_probability(tool) if tool is not None else 1.0  # (the global window: no tool's)
        return hold, back * _share_within(window, hold)

    def resident_ttl(self, tool: str, now: float, context_tokens: int) -> float:
        """How long to keep a program resident through ``tool`` while the door binds (0: it does
        not, or keeping does not pay)."""
        if not self.enabled or self.host_tier or self.stats is None or not self.binding(now):
            return 0.0
        window, _ = self.stats.window_for(tool, min_samples=RESIDENT_MIN_SAMPLES)
        if len(window) == 0:
            return 0.0
        hold, back = self._hold(window, tool)
        size = max(context_tokens, self.working_set.floor)  # the room the door keeps for it
        return hold if hold > 0 and self.keeping_pays(size, hold, back * self.release_loss()) else 0.0

    def holds_first_turns(self) -> bool:
        """Whether the door weighs first turns at all: always without a host tier; with one, only
        while growth is reserved (the module's docstring)."""
        return not self.host_tier or self.working_set.reserve_growth

    def pauses(self, tag: TurnTag, state: Optional[ProgramState]) -> bool:
        """A return that found its context gone, from a program out of the working set, waits while
        the working set leaves it no room: only where a lost context is dear (no host tier, growth
        reserved) and what it lost is worth more rebuilt than the place its wait leaves."""
        if self.host_tier or state is None or state.in_flight > 1:
            return False
        if state.pin_end == RELEASED_FOR_BOUND and not tag.due:
            return True  # released for a turn past its bound: back in, it would take that turn's room
        if not tag.context_gone:
            return False
        if state.program_id in self.working_set or not self.working_set.reserve_growth:
            return False
        if self.stats is None or len(self.stats.global_samples) < RESIDENT_MIN_SAMPLES:
            return True  # before the tools are seen a lost context is priced as dear (growth is reserved)
        hold, _ = self._hold(self.stats.global_samples, None)
        return self.keeping_pays(tag.lost_tokens, hold)

    def _price_growth(self) -> None:
        """Reserve room for growth unless keeping a context of the expected final size through the
        tools' usual time does not pay (before tools and ends are seen, growth is reserved)."""
        working, stats = self.working_set, self.stats
        expected = working.expected_final_context
        if stats is None or expected == 0 or len(stats.global_samples) < RESIDENT_MIN_SAMPLES:
            working.reserve_growth, self._growth_priced_at = True, None
            return
        key = (stats.global_samples.version, expected, self.capacity_tokens, round(self.engine.decode_share, 2))
        if key != self._growth_priced_at:  # priced again only when an input moves
            self._growth_priced_at = key
            hold, _ = self._hold(stats.global_samples, None)
            # a room reserved for growth priced as lost if let go: priced at the release loss (and
            # the share of returns within the hold), it was given away whenever releases had been
            # cheap lately, and the programs let in then thrashed the pool (the demo's GPU part:
            # 1.11x fcfs against 1.32x)
            working.reserve_growth = self.keeping_pays(expected, hold)

    def check_integrity(self) -> None:
        self.engine.check_integrity()
        self.let_go_loss.check_integrity()
        self.holds.check_integrity()
