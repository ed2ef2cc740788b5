"""``ContinuumSchedulePolicy``: program-level FCFS ordering of SGLang's waiting queue."""

from __future__ import annotations

from typing import List, Optional

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy

from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.adapter.request import TAG_ATTR
from sglang_continuum.core.priority import program_fcfs_key


class ContinuumSchedulePolicy(SchedulePolicy):
    """Runs SGLang's FCFS path (which also refreshes prefix matches for the load snapshot), then
    sorts by ``program_fcfs_key``. A queue in which no request names a program is left in FCFS
    order untouched, so clients that send no metadata see exactly ``fcfs``."""

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

    def calc_priority(
        self,
        waiting_queue: List[Req],
        running_batch: Optional[ScheduleBatch] = None,
        processed_tokens: int = 0,
    ) -> None:
        super().calc_priority(waiting_queue, running_batch, processed_tokens)
        cache = self.continuum_cache
        pinned = cache.continuum.pins
        keys = []
        any_program = False
        for req in waiting_queue:
            # tag_request is a no-op unless the request bypassed the enqueue hook
            tag = getattr(req, TAG_ATTR, None) or cache.tag_request(req)
            pid = tag.meta.program_id
            if pid is not None:
                any_program = True
            keys.append(program_fcfs_key(req.is_retracted, pid is not None and pid in pinned,
                                         tag.program_seq, tag.request_seq))
        if any_program:
            order = sorted(range(len(waiting_queue)), key=keys.__getitem__)
            waiting_queue[:] = [waiting_queue[i] for i in order]
