"""``ContinuumSchedulePolicy``: program-level FCFS ordering of SGLang's waiting queue.

The order only changes when a request arrives, when a pin is added or removed (a waiting turn's
"pinned" key), or when a request becomes overdue (bounded waiting). Between those events the
queue only loses admitted requests, which keeps it sorted, so ``calc_priority`` re-sorts only
when one of them happened: the per-step cost is O(1) otherwise.
"""

from __future__ import annotations

import math
from typing import List, Optional

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy

from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.adapter.request import TAG_ATTR


class ContinuumSchedulePolicy(SchedulePolicy):
    """Runs SGLang's FCFS path (which also refreshes prefix matches for the load snapshot), then
    orders by ``ContinuumController.priority_key``. A queue in which no request names a program
    is left in FCFS order untouched, so clients that send no metadata see exactly ``fcfs``."""

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
        self._stale = True
        self._sorted_len = 0
        self._pins_version = -1
        self._next_overdue = math.inf  # earliest time a waiting request becomes overdue
        self.sorts = 0

    def mark_stale(self) -> None:
        self._stale = True

    def calc_priority(
        self,
        waiting_queue: List[Req],
        running_batch: Optional[ScheduleBatch] = None,
        processed_tokens: int = 0,
    ) -> None:
        super().calc_priority(waiting_queue, running_batch, processed_tokens)
        cache = self.continuum_cache
        controller = cache.controller
        now = cache.step_clock()
        if not (
            self._stale
            or len(waiting_queue) > self._sorted_len  # an arrival that bypassed the enqueue hook
            or controller.pins_version != self._pins_version
            or now >= self._next_overdue
        ):
            self._sorted_len = len(waiting_queue)
            return
        keys = []
        any_program = False
        next_overdue = math.inf
        for req in waiting_queue:
            # tag_request is a no-op unless the request bypassed the enqueue hook
            tag = getattr(req, TAG_ATTR, None) or cache.tag_request(req)
            any_program |= tag.meta.program_id is not None
            key = controller.priority_key(tag, req.is_retracted, now)
            keys.append(key)
            due = controller.overdue_at(tag)
            if due is not None and now < due < next_overdue:
                next_overdue = due
        if any_program:
            order = sorted(range(len(waiting_queue)), key=keys.__getitem__)
            waiting_queue[:] = [waiting_queue[i] for i in order]
            self.sorts += 1
        self._stale = False
        self._sorted_len = len(waiting_queue)
        self._pins_version = controller.pins_version
        self._next_overdue = next_overdue
