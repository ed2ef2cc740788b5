"""Per-scheduler glue between SGLang's ``Scheduler`` and the Continuum cache and policy.

Installed once, when a scheduler built with ``--schedule-policy continuum`` initialises its
schedule policy. It wraps methods *of that scheduler instance* (other policies and other
processes are untouched):

* ``_add_request_to_queue``: tags each arriving turn (records tool return times) and marks the
  queue order stale.
* ``get_next_batch_to_run``: first a Continuum step (clock, expiry, offload; memory given back
  re-opens admission), then SGLang's own batch selection, then pin consumption for the turns
  that batch admitted.
* ``get_prefill_adder_class``: SGLang's ``PrefillAdder`` with two additions -- program-level
  admission control (a new program's first turn is skipped while the working sets of programs
  in flight, and of the turns this selection already took, fill the pool, unless the engine
  would idle) and a record of the first turn the budget refused (``NO_TOKEN``).
* ``get_new_batch_prefill``: when SGLang's own admission refused a turn for memory, pins of
  programs ranked after it are shed (latest first) and admission is retried in the same step;
  any pin may be shed when the engine would otherwise idle. A pin therefore never keeps a
  higher-ranked turn out, and never wedges admission.
* ``on_idle``: with ``check_integrity`` set, every invariant is checked while idle. With
  ``--sleep-on-idle`` SGLang parks an idle loop in a zmq poll of up to 1 s (``IdleSleeper``); the
  hooks still run at least once a second (pins expire, statistics are shared, metrics flushed).

Tensor parallelism: every rank runs this same loop over the same requests, so decisions agree as
long as the clock does. With tp_size > 1 the step time is the minimum of the ranks' clocks
(one all-reduce on the CPU group per step), and every decision of that step reads that value.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
from typing import TYPE_CHECKING, Callable, Optional

from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS, AddReqResult, PrefillAdder

from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.adapter.request import get_tag
from sglang_continuum.adapter.schedule_policy import ContinuumSchedulePolicy
from sglang_continuum.adapter.tool_identifier import make_identifier
from sglang_continuum.core.bounded_waiting import MIN_OVERTAKES

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

MAX_ADMISSION_RETRIES = 4  # re-runs of SGLang's prefill selection per step after shedding


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


class Admission:
    """What one prefill selection learned: the first turn SGLang's budget refused, and by how
    many tokens (the adder's own arithmetic)."""

    def __init__(self, scheduler: "Scheduler", cache: ContinuumRadixCache) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.blocked = None
        self.shortfall = 0
        self.candidate: Optional[int] = None  # the shortfall SGLang's selection just refused
        self._classes: dict[type, type] = {}

    def reset(self) -> None:
        self.blocked, self.shortfall, self.candidate = None, 0, None

    def adder_class(self, base: type[PrefillAdder]) -> type[PrefillAdder]:
        cls = self._classes.get(base)
        if cls is None:
            cls = self._classes[base] = self._make_adder_class(base)
        return cls

    def _make_adder_class(self, base: type[PrefillAdder]) -> type[PrefillAdder]:
        admission = self

        class ContinuumPrefillAdder(base):
            # what turns this selection took reserve in the working set: it learns of them only
            # once the batch is formed (``on_admitted``), and the door must not let a wave through
            continuum_pending_tokens = 0

            def add_one_req(self, req, has_chunked_req, truncation_align_size):
                if admission.hold_back(self, req):
                    return AddReqResult.CONTINUE  # skipped; later turns may still be admitted
                admission.candidate = None
                taken = len(self.can_run_list)
                result = super().add_one_req(req, has_chunked_req, truncation_align_size)
                if len(self.can_run_list) > taken:  # committed (the result speaks of the next candidate)
                    self.continuum_pending_tokens += admission.reservation(req)
                if result is AddReqResult.NO_TOKEN and admission.blocked is None:
                    admission.blocked = req
                    if admission.candidate is not None:  # measured while SGLang held the prefix lock
                        admission.shortfall = admission.candidate
                    else:
                        need = (
                            len(req.full_untruncated_fill_ids)
                            - req.prefix_len
                            + self.per_req_token_overhead
                            + min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
                        )
                        admission.shortfall = max(1, int(need - self.memory_budget.remaining_total))
                return result

            def _select_prefill_admission(self, req, *, total_tokens, **kwargs):
                # Runs inside add_one_req's ``_lock_node(req.last_node)``: the turn's own cached
                # prefix is out of the evictable budget here, as SGLang counted it. Read after
                # the lock is gone, the shortfall would be short by that prefix.
                result = super()._select_prefill_admission(req, total_tokens=total_tokens, **kwargs)
                if result is AddReqResult.NO_TOKEN:
                    admission.candidate = max(1, int(total_tokens - self.memory_budget.remaining_total) + 1)  # needs <
                return result

        ContinuumPrefillAdder.__name__ = f"Continuum{base.__name__}"
        return ContinuumPrefillAdder

    def hold_back(self, adder: PrefillAdder, req) -> bool:
        """Admission control for ``req``; never when holding it back would idle the engine."""
        tag = get_tag(req)
        if tag is None or not tag.meta.has_program:
            return False
        idle = adder.running_batch.is_empty() and not adder.can_run_list and self.scheduler.chunked_req is None
        cache = self.cache
        return cache.controller.holds_back(
            tag,
            len(req.origin_input_ids),
            cache.token_to_kv_pool_allocator.size,
            idle=idle,
            pending_tokens=adder.continuum_pending_tokens,
        )

    def reservation(self, req) -> int:
        """What ``req``, just taken into the selection, will reserve in the working set."""
        tag = get_tag(req)
        if tag is None:
            return 0
        return self.cache.controller.admission_reservation(tag, len(req.origin_input_ids))


def install(scheduler: "Scheduler") -> ContinuumSchedulePolicy:
    if scheduler.enable_priority_scheduling:
        # SGLang's priority path re-sorts the waiting queue by (priority, arrival) inside the
        # policy's calc_priority, under the incrementally kept program order
        raise RuntimeError(
            "--schedule-policy continuum does not support --enable-priority-scheduling: Continuum orders "
            "the waiting queue itself (pinned turns, then program arrival). Drop the flag, or use another policy."
        )
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
    controller = cache.controller
    now = _consensus_now(scheduler, cache)
    cache.identify_tool = make_identifier(
        getattr(scheduler, "tokenizer", None), getattr(scheduler.server_args, "tool_call_parser", None)
    )
    admission = Admission(scheduler, cache)
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

    cache.program_waiting = program_waiting
    add_request = scheduler._add_request_to_queue
    next_batch = scheduler.get_next_batch_to_run
    new_prefill = scheduler.get_new_batch_prefill
    adder_class = scheduler.get_prefill_adder_class
    on_idle = scheduler.on_idle

    def _add_request_to_queue(req, is_retracted: bool = False):
        if not scheduler.waiting_queue and scheduler.running_batch.is_empty():
            # It reaches an idle scheduler: the step clock was last set before the loop went idle
            # (with --sleep-on-idle up to a poll ago), so refresh it, or the arrival, and the tool
            # time it measures, is stamped early. Every rank ingests the same requests in the same
            # order while equally idle, so the consensus read pairs up across ranks.
            cache.step_clock.set(now())
        add_request(req, is_retracted=is_retracted)
        if not is_retracted and get_tag(req) is None:
            cache.tag_request(req, waiting_ahead=len(scheduler.waiting_queue) - 1)
        policy.requeued(req)

    def get_prefill_adder_class():
        return admission.adder_class(adder_class())

    def get_new_batch_prefill(running_batch):
        admission.reset()
        plan = new_prefill(running_batch)
        for _ in range(MAX_ADMISSION_RETRIES):
            blocked = admission.blocked
            if blocked is None or not len(controller.pins):
                break
            tag = get_tag(blocked)
            idle = plan.batch_to_run is None and plan.running_batch.is_empty()
            reason = "idle" if idle else "admission"
            if not cache.shed_for(tag, tokens=admission.shortfall, reason=reason, program_waiting=program_waiting):
                break
            plan.running_batch.batch_is_full = False  # memory came back: admission is open again
            if plan.batch_to_run is not None:
                break  # others were admitted this step; the blocked turn gets the memory next step
            admission.reset()
            plan = new_prefill(plan.running_batch)
        return plan

    def get_next_batch_to_run(running_batch, last_batch):
        nonlocal waiting_programs
        waiting_programs = None
        if cache.step(now(), program_waiting):
            # memory given back outside a request's exit: SGLang clears batch_is_full only
            # when a running request leaves, so re-open admission here
            running_batch.batch_is_full = False
        plan = next_batch(running_batch=running_batch, last_batch=last_batch)
        batch = plan.batch_to_run
        if batch is not None and not batch.forward_mode.is_decode():
            for req in batch.reqs:  # newly admitted turns hold their prefix now: consume pins
                cache.on_admitted(req)
        cache.publish_metrics(scheduler.waiting_queue)
        return plan

    next_check = 0.0

    def _on_idle():
        nonlocal next_check
        cache.exchange_stats(cache.step_clock.read_source())  # an idle worker still shares and learns
        cache.publish_metrics(scheduler.waiting_queue, force=True)  # the last step's changes reach /metrics
        if cache.event_log is not None:
            cache.event_log.flush()
        if cache.has_queued_turns() and not scheduler.waiting_queue and scheduler.is_fully_idle():
            cache.forget_unqueued()
        if (
            cache.settings.check_integrity
            and cache.step_clock.read_source() >= next_check
            and scheduler.is_fully_idle()
        ):
            next_check = cache.step_clock.read_source() + 1.0  # the idle loop spins: once a second is plenty
            cache.check_integrity()
        return on_idle()

    scheduler._add_request_to_queue = _add_request_to_queue
    scheduler.get_next_batch_to_run = get_next_batch_to_run
    scheduler.get_new_batch_prefill = get_new_batch_prefill
    scheduler.get_prefill_adder_class = get_prefill_adder_class
    scheduler.on_idle = _on_idle
    policy.admission = admission  # read by tests: the last selection's blocked turn
    _save_stats_on_sigterm(cache)
    logger.info(
        "continuum: active (rules %s, ttl model %s, pin budget %d tokens, overdue after %d overtakes (down to %d "
        "as the pool thrashes), admission control %s)",
        controller.rules.name,
        controller.ttl_model.name,
        controller.pins.budget_tokens,
        cache.settings.max_overtakes,
        min(MIN_OVERTAKES, cache.settings.max_overtakes),
        "on" if cache.settings.admission_control else "off",
    )
    return policy


def _save_stats_on_sigterm(cache: ContinuumRadixCache) -> None:
    """Save statistics whenever the scheduler process stops: a graceful exit (SIGTERM to the
    launcher sends the schedulers a ``ShutdownReq``; they leave their loop and the interpreter
    exits, running ``atexit``), or a SIGTERM to the process itself (a process-group SIGTERM, and
    the launcher's wrapped ``kill_process_tree``, see ``plugin.py``), after which it stops as
    SIGTERM would have."""
    if cache.saver is None:
        return
    atexit.register(cache.save_stats_now)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        cache.save_stats_now()
        signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
