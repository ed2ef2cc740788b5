"""Programs whose clients never say they ended: what their silence means.

Real agents send no last-step flag, and most send no id at all. A finished program whose end
nobody announced would keep its program-FCFS rank, its pin's claim on the budget and its place in
the working set until its pin expires, and it would never teach the policy how far programs grow
or which tools end them. Its silence is read against its own pace, for programs whose client
announces no ends (``ProgramMeta.announces_end``; a client that does is taken at its word):

* *stale pin*: away longer than ``STALE_FACTOR`` times the longest tool call it came back from,
  its pin is the first to go when a new pin needs the budget or memory is short -- before any live
  program's, whatever the ranks -- and costs nothing while nobody needs the room;
* *presumed ended*: away longer than ``PRESUME_FACTOR`` times that (at least ``PRESUME_FLOOR_S``;
  a program that has not come back from a tool yet: that many times the tool's own 90th
  percentile, or ``COLD_HORIZON_S`` before it has one) and holding no pin, it ends as a forgotten
  program does: its final context and its tool's failure to return are learned, it leaves the
  working set, and if it comes back it is a new program with the latest rank. Such late returns
  are remembered for a while and teach the tool's time and return.

Lazy heaps: an entry is checked when it falls due, and dropped if its program came back meanwhile.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Callable, Iterator, Optional

from sglang_continuum.core.pins import Pin, PinTable
from sglang_continuum.core.programs import ProgramRegistry, ProgramState
from sglang_continuum.core.tool_stats import ToolStats

STALE_FACTOR = 1.5
PRESUME_FACTOR = 4.0
PRESUME_FLOOR_S = 10.0
COLD_HORIZON_S = 60.0
REMEMBERED = 4096  # presumed-ended programs remembered, to learn from those that come back


class Silence:
    def __init__(self, stats: ToolStats, programs: ProgramRegistry) -> None:
        self.stats = stats
        self.programs = programs
        self._seq = itertools.count()
        # (when, seq, program state, its last finish then): presumed ended at ``when`` if still away
        self._presume: list[tuple[float, int, ProgramState, float]] = []
        # (when, seq, pin, its program's last finish then): the pin is stale from ``when``
        self._stale: list[tuple[float, int, Pin, float]] = []
        self._remembered: OrderedDict[str, tuple[float, str]] = OrderedDict()  # pid -> (last finish, tool)

    # -- events ------------------------------------------------------------------------------
    def went_out(self, state: ProgramState) -> None:
        """``state``'s turn finished and it is out on ``state.pending_tool`` now."""
        if state.announces_end or state.last_finish is None:
            return
        entry = (state.last_finish + self._horizon(state), next(self._seq), state, state.last_finish)
        self._presume = self._push(self._presume, entry, lambda e: self._away(e[2], e[3], self.programs))

    def pinned(self, pin: Pin, state: ProgramState) -> None:
        if state.announces_end or state.gaps == 0 or state.last_finish is None:
            return  # no pace of its own to read silence against yet
        entry = (state.last_finish + STALE_FACTOR * state.longest_gap, next(self._seq), pin, state.last_finish)
        self._stale = self._push(self._stale, entry, self._stale_valid)

    def presumed(self, state: ProgramState) -> None:
        """``state`` was presumed ended (and forgotten)."""
        if state.last_finish is not None and state.pending_tool is not None:
            self._remembered[state.program_id] = (state.last_finish, state.pending_tool)
            while len(self._remembered) > REMEMBERED:
                self._remembered.popitem(last=False)

    def came_back(self, program_id: str, now: float) -> Optional[tuple[str, float]]:
        """A program presumed ended came back: (the tool it was out on, how long it took)."""
        found = self._remembered.pop(program_id, None)
        if found is None:
            return None
        last_finish, tool = found
        return tool, max(0.0, now - last_finish)

    # -- what is due -------------------------------------------------------------------------
    def due(self, now: float, programs: ProgramRegistry) -> Iterator[ProgramState]:
        """Programs still away past their horizon (the caller ends them, or looks again later)."""
        heap = self._presume
        while heap and heap[0][0] <= now:
            _, _, state, since = heapq.heappop(heap)
            if self._away(state, since, programs):
                yield state

    def presume_ended(self, now: float, programs: ProgramRegistry, pins: PinTable) -> list[ProgramState]:
        """Programs away past their horizon, forgotten and remembered as presumed ended (the caller
        drops what they held); one whose pin still holds is looked at again when it ends (the cost
        model still expects it back)."""
        ended = []
        for state in list(self.due(now, programs)):
            pin = pins.get(state.program_id)
            if pin is not None:
                self.later(state, pin.deadline)
                continue
            programs.forget(state.program_id)
            self.presumed(state)
            ended.append(state)
        return ended

    def later(self, state: ProgramState, when: float) -> None:
        """Look at ``state`` again at ``when`` (it still held a pin)."""
        heapq.heappush(self._presume, (when, next(self._seq), state, state.last_finish))

    def stale_pin(
        self,
        now: float,
        pins: PinTable,
        programs: ProgramRegistry,
        *,
        keep: Optional[str] = None,
        spare: Optional[Callable[[Pin], bool]] = None,
    ) -> Optional[Pin]:
        """A live pin whose program has been away past ``STALE_FACTOR`` times its longest gap (not
        ``keep``'s, none ``spare`` spares), popped from the table; None if there is none."""
        heap, skipped, found = self._stale, [], None
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            pin = entry[2]
            state = programs.get(pin.program_id)
            if pins.get(pin.program_id) is not pin or state is None or not self._away(state, entry[3], programs):
                continue  # consumed, ended, or its program came back
            if pin.program_id == keep or (spare is not None and spare(pin)):
                skipped.append(entry)
                continue
            found = pins.pop(pin.program_id)
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    # -- internals ---------------------------------------------------------------------------
    def _push(self, heap: list, entry: tuple, valid: Callable[[tuple], bool]) -> list:
        """Push, dropping entries of programs that came back or ended once they outnumber the
        programs (each program has at most one valid entry per heap)."""
        heapq.heappush(heap, entry)
        if len(heap) > 2 * len(self.programs) + 64:
            heap = [e for e in heap if valid(e)]
            heapq.heapify(heap)
        return heap

    def _horizon(self, state: ProgramState) -> float:
        if state.gaps > 0:
            return max(PRESUME_FLOOR_S, PRESUME_FACTOR * state.longest_gap)
        window, _ = self.stats.window_for(state.pending_tool or "", min_samples=10)
        if len(window) == 0:
            return COLD_HORIZON_S
        p90 = float(window.sorted[int(0.9 * (len(window) - 1))])
        return max(PRESUME_FLOOR_S, PRESUME_FACTOR * p90)

    def _stale_valid(self, entry: tuple) -> bool:
        state = self.programs.get(entry[2].program_id)
        return state is not None and self._away(state, entry[3], self.programs)

    @staticmethod
    def _away(state: ProgramState, since: float, programs: ProgramRegistry) -> bool:
        """``state`` is the registered program, nothing of it in flight, last seen finishing at ``since``."""
        return programs.get(state.program_id) is state and state.in_flight == 0 and state.last_finish == since

    def check_integrity(self) -> None:
        assert len(self._remembered) <= REMEMBERED, "remembered presumed ends over the bound"
        for heap in (self._presume, self._stale):
            assert all(heap[(i - 1) // 2][:2] <= heap[i][:2] for i in range(1, len(heap))), "heap order"

    def __len__(self) -> int:
        return len(self._presume) + len(self._stale)
