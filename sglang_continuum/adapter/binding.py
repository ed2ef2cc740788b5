"""Per-scheduler glue between SGLang's ``Scheduler`` and the Continuum cache and policy.

Installed once, when a scheduler built with ``--schedule-policy continuum`` initialises its
schedule policy. It wraps two methods *of that scheduler instance* (other policies and other
processes are untouched):

* ``_add_request_to_queue``: tags each arriving turn (records tool return times);
* ``get_next_batch_to_run``: first a Continuum step (clock, expiry, offload, predictive reload),
  then SGLang's own batch selection, then pin consumption for the turns that batch admitted, then
  stall shedding: if nothing runs, nothing was admitted, and the head of the queue cannot fit in
  free + evictable memory, pins are shed (latest program arrival first) until it fits. A pin
  therefore never wedges admission.

Tensor parallelism: every rank runs this same loop over the same requests, so decisions agree as
long as the clock does. With tp_size > 1 the step time is the minimum of the ranks' clocks
(one all-reduce on the CPU group per step), and every decision of that step reads that value.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.adapter.request import get_tag
from sglang_continuum.adapter.schedule_policy import ContinuumSchedulePolicy
from sglang_continuum.adapter.tool_identifier import make_identifier

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)


def _consensus_now(scheduler: "Scheduler", cache: ContinuumRadixCache) -> Callable[[], float]:
    read = cache.step_clock.read_source
    tp_size = getattr(scheduler, "tp_size", 1) or 1
    group = getattr(scheduler, "tp_cpu_group", None)
    if tp_size <= 1 or group is None:
        return read

    import torch
    import torch.distributed as dist

    buf = torch.zeros(1, dtype=torch.float64)

    def agreed() -> float:
        buf[0] = read()
        dist.all_reduce(buf, op=dist.ReduceOp.MIN, group=group)
        return float(buf[0])

    return agreed


def head_fits(scheduler: "Scheduler", cache: ContinuumRadixCache) -> bool:
    """Whether the head of the waiting queue fits in free + evictable KV (a conservative copy of
    the admission estimate: uncached input plus clipped output, plus a page)."""
    if not scheduler.waiting_queue:
        return True
    req = scheduler.waiting_queue[0]
    prefix = getattr(req, "prefix_len", 0) or 0
    need = (
        len(req.origin_input_ids) + len(req.output_ids) - prefix
        + min(req.sampling_params.max_new_tokens or 0, CLIP_MAX_NEW_TOKENS)
        + scheduler.page_size
    )
    have = cache.token_to_kv_pool_allocator.available_size() + cache.evictable_size()
    return need <= have


def install(scheduler: "Scheduler") -> ContinuumSchedulePolicy:
    cache = scheduler.tree_cache
    if not isinstance(cache, ContinuumRadixCache):
        raise RuntimeError(
            "--schedule-policy continuum is selected but the tree cache is "
            f"{type(cache).__name__}, not ContinuumRadixCache. Continuum needs SGLang's default "
            "unified radix cache (it is not compatible with --disable-radix-cache, "
            "--radix-cache-backend, LMCache, FlexKV or pure-SWA models)."
        )
    policy = ContinuumSchedulePolicy(
        cache,
        scheduler.enable_hierarchical_cache,
        scheduler.enable_priority_scheduling,
        scheduler.schedule_low_priority_values_first,
    )
    now = _consensus_now(scheduler, cache)
    cache.identify_tool = make_identifier(
        getattr(scheduler, "tokenizer", None), getattr(scheduler.server_args, "tool_call_parser", None)
    )
    waiting_programs: Optional[set] = None

    def program_waiting(pid: str) -> bool:
        nonlocal waiting_programs
        if waiting_programs is None:  # built at most once per step, and only if a pin expires
            waiting_programs = set()
            for req in scheduler.waiting_queue:
                tag = get_tag(req)
                if tag is not None and tag.meta.program_id is not None:
                    waiting_programs.add(tag.meta.program_id)
        return pid in waiting_programs

    add_request = scheduler._add_request_to_queue
    next_batch = scheduler.get_next_batch_to_run

    def _add_request_to_queue(req, is_retracted: bool = False):
        add_request(req, is_retracted=is_retracted)
        if not is_retracted and get_tag(req) is None:
            cache.tag_request(req)

    def get_next_batch_to_run(running_batch, last_batch):
        nonlocal waiting_programs
        waiting_programs = None
        cache.step(now(), program_waiting)
        plan = next_batch(running_batch=running_batch, last_batch=last_batch)
        batch = plan.batch_to_run
        if batch is not None and not batch.forward_mode.is_decode():
            for req in batch.reqs:  # newly admitted turns hold their prefix now: consume pins
                cache.on_admitted(req)
            if cache.host_tier is not None and batch.hicache_consumer_index < 0:
                # a predictive reload still in flight: this batch may read its KV, so its forward
                # waits on that load's layer events like on a load of its own
                batch.hicache_consumer_index = cache.host_tier.reload_pending_index()
        if (
            plan.batch_to_run is None
            and scheduler.waiting_queue
            and (plan.running_batch is None or plan.running_batch.is_empty())
            and scheduler.chunked_req is None
            and len(cache.continuum.pins)
        ):
            head = get_tag(scheduler.waiting_queue[0])
            keep = head.meta.program_id if head is not None else None
            shed = cache.shed_until(lambda: head_fits(scheduler, cache), keep_program=keep)
            if shed:
                logger.info("continuum: admission stalled; shed %d pin(s)", shed)
        return plan

    scheduler._add_request_to_queue = _add_request_to_queue
    scheduler.get_next_batch_to_run = get_next_batch_to_run
    logger.info(
        "continuum: active (ttl_model=%s, pin budget=%d tokens)",
        cache.settings.ttl_model,
        cache.continuum.pins.budget_tokens,
    )
    return policy
