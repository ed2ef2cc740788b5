"""``ContinuumSchedulePolicy``: program-level FCFS ordering of SGLang's waiting queue, kept
incrementally.

A waiting request's key (``ContinuumController.priority_key``) changes only when it is re-queued
(retraction), when its program's pin comes or goes, when its program's first turn is admitted
ahead of it (it is no new program's turn any more), or when it becomes overdue (bounded
waiting). Between steps SGLang only removes admitted or aborted requests (which keeps the queue
sorted) and appends arrivals at the tail. So the queue stays sorted by the key each request was
placed with (stored on the request), and a step does only:

* arrivals: the tail of requests without a placed key, each inserted by bisection;
* pin changes: the requests of the programs whose pin changed since the last step (the pin
  table's change log; an index program -> placed requests), and of the programs admitted for the
  first time while another of their turns waited (the controller's ``rekeyed``), moved;
* overdue: requests whose bound passed, moved: a heap by the overtaking clock at which they are
  overtaken as many times as their budget.

A request is found in the queue by bisecting on its placed key (keys are unique: they end in the
request's arrival rank), so a request that has left is simply not found. Anything not known
incrementally (a cache flush, an outrun change log) falls back to one full sort, and so does a
queue found out of order by the audit every ``AUDIT_EVERY`` steps (a request put back by a path
that bypasses ``_add_request_to_queue``). With ``check_integrity`` on, every step verifies the
queue against freshly computed keys.

A queue in which no request has named a program since it was last empty is left in FCFS order
untouched, so clients that send no metadata see exactly ``fcfs``.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import operator
from typing import Iterable, List, Optional

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy

from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.adapter.request import get_tag
from sglang_continuum.core.priority import NEW, door_exempt

logger = logging.getLogger(__name__)
AUDIT_EVERY = 128  # steps between cheap order audits (catches requests re-queued behind our back)
KEY_ATTR = "_continuum_queue_key"  # the key the request was placed with; None: not placed yet
_FCFS = (-1, 0, 0)  # placed in FCFS mode (no program seen): list order is the order


def _placed_key(req: Req) -> tuple:
    return getattr(req, KEY_ATTR)


class ContinuumSchedulePolicy(SchedulePolicy):
    """Runs SGLang's FCFS path (which also refreshes prefix matches for the load snapshot), then
    keeps the queue ordered by ``ContinuumController.priority_key``."""

    def __init__(
        self,
        tree_cache: ContinuumRadixCache,
        enable_hierarchical_cache: bool,
        enable_priority_scheduling: bool,
        schedule_low_priority_values_first: bool,
    ) -> None:
        super().__init__(
            "fcfs",
            tree_cache,
            enable_hierarchical_cache,
            enable_priority_scheduling,
            schedule_low_priority_values_first,
        )
        self.continuum_cache = tree_cache
        self.verify = bool(tree_cache.settings.check_integrity)
        self._programs_seen = False  # a request named a program since the queue was last empty
        self._rebuild = True
        self._pins_version = -1
        self._by_program: dict[str, list[Req]] = {}  # placed requests per program (lazily pruned)
        self._indexed = 0
        self._due: list[tuple[int, int, Req]] = []  # (overdue after N admissions, rank, request)
        # the requests placed in the last class (``NEW``), pruned lazily: first turns of new programs
        # as (prompt tokens, placed key, request), whose shortest tells when every one is held, and
        # those the door never holds (no program) as (negated ranks, placed key, request), whose
        # latest tells whether one waits behind a held first turn
        self._first_turns: list[tuple[int, tuple, Req]] = []
        self._exempt: list[tuple[tuple, tuple, Req]] = []
        self._steps = 0
        self.sorts = 0  # full sorts (a benchmark and test figure)
        self.moves = 0  # incremental insertions and moves

    # -- called by the binding -------------------------------------------------------------
    def mark_stale(self) -> None:
        """Order unknown (e.g. the cache was flushed): sort fully at the next step."""
        self._rebuild = True

    def shortest_first_turn(self, queue: List[Req]) -> Optional[int]:
        """The prompt tokens of the shortest first turn of a new program in ``queue`` (None: none)."""
        top = self._top(self._first_turns, queue)
        return None if top is None else top[0]

    def exempt_behind(self, queue: List[Req], key: tuple) -> bool:
        """Whether a request the door never holds waits in ``queue`` behind the one placed at ``key``."""
        top = self._top(self._exempt, queue)
        return top is not None and top[1] > key

    def _top(self, heap: list, queue: List[Req]) -> Optional[tuple]:
        """The top of one of the last class's heaps; an entry whose request left the queue, or was
        placed again, goes when it reaches the top."""
        while heap:
            _, key, req = heap[0]
            if getattr(req, KEY_ATTR, None) is key and self._waiting(queue, req, key):
                return heap[0]
            heapq.heappop(heap)
        return None

    def requeued(self, req: Req) -> None:
        """``req`` entered the waiting queue (arrival or retraction): place it afresh."""
        setattr(req, KEY_ATTR, None)

    # -- SchedulePolicy ------------------------------------------------------------------
    def calc_priority(
        self,
        waiting_queue: List[Req],
        running_batch: Optional[ScheduleBatch] = None,
        processed_tokens: int = 0,
    ) -> None:
        super().calc_priority(waiting_queue, running_batch, processed_tokens)
        queue = waiting_queue
        rekeyed, self.continuum_cache.controller.rekeyed = self.continuum_cache.controller.rekeyed, set()
        if not queue:
            self._forget_all()
            return
        cut = len(queue)
        while cut > 0 and getattr(queue[cut - 1], KEY_ATTR, None) is None:
            cut -= 1
        arrivals = queue[cut:]
        cache = self.continuum_cache
        for req in arrivals:
            tag = get_tag(req) or cache.request_queued(req)  # a request that bypassed the enqueue hook
            self._programs_seen |= tag.meta.program_id is not None
        if not self._programs_seen:
            for req in arrivals:
                setattr(req, KEY_ATTR, _FCFS)
            self._rebuild = True  # the first program to arrive makes the keys matter
            return
        controller = cache.controller
        changed = controller.pins.changed_since(self._pins_version)
        self._pins_version = controller.pins.version
        if changed is not None:
            changed |= rekeyed
        self._steps += 1
        if self._steps % AUDIT_EVERY == 0 and not self._sorted(queue[:cut]):
            logger.warning("continuum: waiting queue found out of order; re-sorting")
            self._rebuild = True
        if self._rebuild or changed is None:
            self._sort_all(queue)
        else:
            del queue[cut:]
            for pid in changed:
                self._move(queue, self._by_program.get(pid, ()))
            due, pace = self._due, controller.bounded.overtake_clock
            while due and due[0][0] <= pace:
                self._move(queue, (heapq.heappop(due)[2],))
            for req in arrivals:
                self._insert(queue, req)
            limit = 2 * len(queue) + 64
            if self._indexed > limit or len(due) > limit or len(self._first_turns) + len(self._exempt) > limit:
                self._reindex(queue)
        if self.verify:
            self.check_order(queue)

    # -- integrity -----------------------------------------------------------------------
    def check_order(self, queue: List[Req]) -> None:
        """Every request's placed key is its current key and the queue is sorted by it."""
        if not self._programs_seen:
            return
        controller = self.continuum_cache.controller
        keys = [_placed_key(r) for r in queue]
        for req, key in zip(queue, keys):
            fresh = controller.priority_key(get_tag(req), req.is_retracted)
            assert key == fresh, f"stale queue key for {req.rid}: placed {key}, now {fresh}"
        assert all(a < b for a, b in zip(keys, keys[1:])), "waiting queue out of order"

    # -- internals -----------------------------------------------------------------------
    @staticmethod
    def _sorted(reqs: List[Req]) -> bool:
        keys = [getattr(r, KEY_ATTR, None) for r in reqs]
        if any(k is None or k is _FCFS for k in keys):
            return False
        return all(map(operator.lt, keys, keys[1:]))

    def _key(self, req: Req) -> tuple:
        return self.continuum_cache.controller.priority_key(get_tag(req), req.is_retracted)

    def _place(self, req: Req) -> tuple:
        """Compute and store ``req``'s key; index it by the overtaking clock that makes it overdue."""
        key = self._key(req)
        setattr(req, KEY_ATTR, key)
        tag = get_tag(req)
        controller = self.continuum_cache.controller
        after = controller.bounded.overdue_after(tag)
        if after is not None and after > controller.bounded.overtake_clock:
            heapq.heappush(self._due, (after, tag.request_rank, req))
        if key[0] == NEW:
            if door_exempt(tag):
                heapq.heappush(self._exempt, ((-key[1], -key[2]), key, req))
            else:
                heapq.heappush(self._first_turns, (len(req.origin_input_ids), key, req))
        return key

    @staticmethod
    def _waiting(queue: List[Req], req: Req, key: tuple) -> bool:
        i = bisect.bisect_left(queue, key, key=_placed_key)
        return i < len(queue) and queue[i] is req

    def _insert(self, queue: List[Req], req: Req) -> None:
        key = self._place(req)
        queue.insert(bisect.bisect_left(queue, key, key=_placed_key), req)
        pid = get_tag(req).meta.program_id
        if pid is not None:
            self._by_program.setdefault(pid, []).append(req)
            self._indexed += 1
        self.moves += 1

    def _move(self, queue: List[Req], reqs: Iterable[Req]) -> None:
        """Re-key requests that may still wait (found by bisecting on their placed key)."""
        for req in list(reqs):
            key = getattr(req, KEY_ATTR, None)
            if key is None or key is _FCFS:
                continue
            i = bisect.bisect_left(queue, key, key=_placed_key)
            if i < len(queue) and queue[i] is req:
                del queue[i]
                key = self._place(req)
                queue.insert(bisect.bisect_left(queue, key, key=_placed_key), req)
                self.moves += 1
            else:  # it left the queue (admitted or aborted): forget it
                self._unindex(req)

    def _unindex(self, req: Req) -> None:
        pid = get_tag(req).meta.program_id
        reqs = self._by_program.get(pid)
        if reqs is not None and req in reqs:
            reqs.remove(req)
            self._indexed -= 1
            if not reqs:
                del self._by_program[pid]

    def _sort_all(self, queue: List[Req]) -> None:
        self._due.clear()
        self._first_turns.clear()
        self._exempt.clear()
        for req in queue:
            self._place(req)
        queue.sort(key=_placed_key)
        self._reindex(queue)
        self._rebuild = False
        self.sorts += 1

    def _reindex(self, queue: List[Req]) -> None:
        self._by_program.clear()
        for req in queue:
            pid = get_tag(req).meta.program_id
            if pid is not None:
                self._by_program.setdefault(pid, []).append(req)
        self._indexed = sum(map(len, self._by_program.values()))
        self._due = self._pruned(self._due, queue)
        self._first_turns = self._pruned_last(self._first_turns, queue)
        self._exempt = self._pruned_last(self._exempt, queue)

    def _pruned_last(self, heap: list, queue: List[Req]) -> list:
        """One of the last class's heaps without the entries of requests that left or moved."""
        if len(heap) <= len(queue):
            return heap
        heap = [e for e in heap if getattr(e[2], KEY_ATTR, None) is e[1] and self._waiting(queue, e[2], e[1])]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def _pruned(heap: list, queue: List[Req]) -> list:
        """Drop entries of requests that left, and duplicates."""
        if len(heap) <= len(queue):
            return heap
        waiting = {id(r) for r in queue}
        kept = {}
        for entry in heap:
            if id(entry[2]) in waiting:
                kept.setdefault(id(entry[2]), entry)
        heap = list(kept.values())
        heapq.heapify(heap)
        return heap

    def _forget_all(self) -> None:
        self._programs_seen = False
        self._by_program.clear()
        self._indexed = 0
        self._due.clear()
        self._first_turns.clear()
        self._exempt.clear()
