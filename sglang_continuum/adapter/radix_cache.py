"""``ContinuumRadixCache``: SGLang's ``UnifiedRadixCache`` with TTL pins.

A pin is an ordinary tree lock (``lock(req.last_node)``) taken when a checkpointed, non-final
turn is released, and owned by the controller's pin table. Because it is a lock, the pinned
prefix is protected (not evictable, not counted as admission budget) by SGLang's own machinery,
and giving it back is an ``unlock``. The pin is taken in ``on_release`` right after the
request's own lock is dropped, in the same call, so the prefix is never unprotected in between;
it is consumed once the program's next turn is admitted, holding its own lock on the prefix.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_continuum.adapter.metrics import ContinuumMetrics
from sglang_continuum.adapter.request import context_tokens, get_tag, read_program_meta, set_tag
from sglang_continuum.core.clock import Clock, StepClock, monotonic_clock
from sglang_continuum.core.controller import ContinuumController, TurnTag
from sglang_continuum.core.metadata import MalformedReporter
from sglang_continuum.core.pins import Pin
from sglang_continuum.core.persistence import load_stats, save_stats
from sglang_continuum.core.settings import ContinuumSettings

logger = logging.getLogger(__name__)

ADMITTED_ATTR = "_continuum_admitted"

# Identifies the tool a finished turn called: (req) -> tool name or None. Set by the binding.
ToolIdentifier = Callable[[Req], Optional[str]]


class ContinuumRadixCache(UnifiedRadixCache):
    def __init__(
        self,
        params: CacheInitParams,
        *,
        settings: Optional[ContinuumSettings] = None,
        clock: Clock = monotonic_clock,
    ) -> None:
        self.continuum: Optional[ContinuumController] = None  # reset() runs inside super().__init__
        super().__init__(params)
        self.settings = settings or ContinuumSettings.load()
        self.step_clock = StepClock(clock)
        budget = int(self.token_to_kv_pool_allocator.size * self.settings.pin_budget_fraction)
        self.continuum = ContinuumController(self.settings, clock=self.step_clock, budget_tokens=budget)
        self.report_malformed = MalformedReporter()
        tp_rank = 0
        if params.tp_cache_group is not None:
            import torch.distributed as dist

            tp_rank = dist.get_rank(group=params.tp_cache_group)
        self.metrics: Optional[ContinuumMetrics] = None
        if params.enable_metrics:
            self.metrics = ContinuumMetrics(tp_rank=tp_rank)
        self.identify_tool: ToolIdentifier = lambda req: None
        self._started: list = []  # (tag, uncached tokens) of returning misses admitted last step
        self._is_stats_writer = tp_rank == 0 and params.pp_rank == 0
        self._next_stats_save = self.step_clock() + self.settings.stats_save_interval_s
        if self.settings.stats_path:
            load_stats(self.continuum, self.settings.stats_path)

    # -- request lifecycle ---------------------------------------------------------------
    def tag_request(self, req: Req) -> TurnTag:
        """A turn arrived (entered the waiting queue for the first time)."""
        tag = get_tag(req)
        if tag is None:
            tag = self.continuum.turn_arrived(read_program_meta(req, self.report_malformed))
            set_tag(req, tag)
        return tag

    def on_release(self, req: Req, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        tag = get_tag(req)
        if self.continuum is None or tag is None or not tag.meta.has_program:
            return
        pid = tag.meta.program_id
        aborted = isinstance(req.finished_reason, FINISH_ABORT)
        if checkpointed and req.finished() and not aborted:
            # decoding the output to find the tool is skipped when the client named it or no pin follows
            parse = not (tag.meta.tool_name or tag.meta.is_last_step)
            self.finish_turn(tag.meta, req.last_node, context_tokens(req), self.identify_tool(req) if parse else None)
        elif req.finished():  # aborted
            self._release(self.continuum.turn_aborted(tag.meta))
        else:  # retracted: it will queue again; its pin (if any) must not hold memory meanwhile
            pin = self.continuum.pins.pop(pid)
            if pin is not None:
                self.continuum.counters.released += 1
                self._release([pin])

    def finish_turn(self, meta, node, tokens: int, tool: Optional[str]) -> Optional[Pin]:
        """A turn's context is in the tree at ``node`` (``tokens`` long): pin it or not."""
        handle = None if meta.is_last_step else self.lock(node)
        outcome = self.continuum.turn_finished(meta, context_tokens=tokens, tool=tool, handle=handle)
        if outcome.pin is None and handle is not None:
            self.unlock(handle)
        if outcome.ttl is not None and self.metrics is not None:
            self.metrics.observe_ttl(outcome.ttl)
        self._release(outcome.release)
        return outcome.pin

    # -- called by the binding ----------------------------------------------------------
    def on_admitted(self, req: Req) -> None:
        """``req`` was just admitted into a prefill batch and holds its own lock on its prefix."""
        if getattr(req, ADMITTED_ATTR, False):
            return
        setattr(req, ADMITTED_ATTR, True)
        tag = get_tag(req)
        if tag is not None:
            self._release([self.continuum.turn_admitted(tag)])
            if tag.returning_miss:  # T is observed once its first batch has run (next step)
                uncached = len(req.origin_input_ids) - (getattr(req, "prefix_len", 0) or 0)
                self._started.append((tag, max(0, uncached)))

    def step(self, now: float, program_waiting: Callable[[str], bool]) -> None:
        """Once per scheduler iteration: advance the clock, expire pins, publish metrics."""
        self.step_clock.set(now)
        if self._started:
            for tag, uncached in self._started:
                self.continuum.turn_started(tag, uncached)
            self._started.clear()
        self._release(self.continuum.expire(program_waiting))
        if self.metrics is not None:
            self.metrics.update(self.continuum)
        if self.settings.stats_path and now >= self._next_stats_save:
            self._next_stats_save = now + self.settings.stats_save_interval_s
            self.save_stats()

    def save_stats(self) -> None:
        if self.settings.stats_path and self._is_stats_writer:
            save_stats(self.continuum, self.settings.stats_path)

    def shed_until(self, fits: Callable[[], bool], keep_program: Optional[str] = None) -> int:
        """Release pins, latest program arrival first, until ``fits()``; return how many."""
        shed = 0
        kept: Optional[Pin] = None
        while not fits():
            pin = self.continuum.shed_one()
            if pin is None:
                break
            if pin.program_id == keep_program:
                self.continuum.counters.shed -= 1
                kept = pin
                continue
            self._release([pin])
            shed += 1
        if kept is not None:
            self._release(self.continuum.pins.add(kept))
        return shed

    # -- SGLang hooks --------------------------------------------------------------------
    def evict_for_alloc(self, params: EvictParams, *, allocation_reclaim_satisfied=None) -> EvictResult:
        allocator = self.token_to_kv_pool_allocator
        target = allocator.available_size() + params.num_tokens
        result = super().evict_for_alloc(params, allocation_reclaim_satisfied=allocation_reclaim_satisfied)
        if self.continuum is None or not len(self.continuum.pins):
            return result

        def satisfied() -> bool:
            if allocation_reclaim_satisfied is not None:
                return allocation_reclaim_satisfied()
            return allocator.available_size() >= target

        # An allocation that cannot be served must never wait on a pin: shed, then evict again.
        while not satisfied():
            pin = self.continuum.shed_one()
            if pin is None:
                break
            self._release([pin])
            more = super().evict_for_alloc(
                EvictParams(num_tokens=max(0, target - allocator.available_size()), swa_num_tokens=params.swa_num_tokens, mamba_num=params.mamba_num),
                allocation_reclaim_satisfied=allocation_reclaim_satisfied,
            )
            result.num_tokens_evicted += more.num_tokens_evicted
            result.swa_num_tokens_evicted += more.swa_num_tokens_evicted
            result.mamba_num_evicted += more.mamba_num_evicted
        return result

    def shutdown(self) -> None:
        self.save_stats()  # warm start for the next server
        super().shutdown()

    def reset(self) -> None:
        # flush_cache rebuilds the tree: pins point at nodes that no longer exist, so drop them
        # without unlocking.
        if self.continuum is not None:
            self.continuum.pins.clear()
        super().reset()

    # -- internals -----------------------------------------------------------------------
    def _release(self, pins: Iterable[Optional[Pin]]) -> None:
        for pin in pins:
            if pin is not None and pin.handle is not None:
                self.unlock(pin.handle)
                pin.handle = None
