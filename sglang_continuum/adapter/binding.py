"""Per-scheduler glue between SGLang's ``Scheduler`` and the Continuum cache and policy.

Installed once, when a scheduler built with ``--schedule-policy continuum`` initialises its
schedule policy. ``SchedulerBinding`` wraps methods *of that scheduler instance* (other policies
and other processes are untouched), one method per hook:

* ``_add_request_to_queue``: a request SGLang appended to its waiting queue entered the lifecycle
  (``lifecycle.py``): a turn arrived (tool return times recorded), or a retracted one is back.
* ``get_next_batch_to_run``: first a Continuum step (clock, expiry, offload; memory given back
  re-opens admission), then SGLang's own batch selection.
* ``get_prefill_adder_class``: SGLang's ``PrefillAdder`` with program-level admission control (a
  new program's first turn is skipped while the working sets of programs in flight, and of the
  turns this selection already took, fill the pool, unless the engine would idle; behind an overdue
  first turn so held, later first turns wait too) and a record of the first turn the budget
  refused (``NO_TOKEN``). The queue order puts first turns last (``priority.py``): a held one
  behind which no first turn waiting would fit, and no request the door never holds waits, ends
  the selection (``AddReqResult.OTHER``), so the turns behind it, which the door would hold as
  well, are never matched against the radix tree: a step costs what it costs under ``fcfs``
  however many wait.
* ``get_new_batch_prefill``: the turns a selection admitted consume their pins at once; when
  SGLang's admission refused a turn for memory, pins of programs ranked after it are shed (latest
  first) and admission is retried in the same step; any pin may be shed when the engine would
  otherwise idle, or for a turn whose hold bound passed (``core/residency.py``: the resident
  program released takes its own turn later). A pin therefore never keeps a higher-ranked turn
  out, never keeps a held turn past its bound, and never wedges admission.
* ``on_idle``: requests SGLang let go unseen are ended; with ``check_integrity`` set, every
  invariant is checked while idle. With ``--sleep-on-idle`` SGLang parks an idle loop in a zmq poll
  of up to 1 s; the hooks still run at least once a second.

Tensor parallelism: every rank runs this same loop over the same requests, so decisions agree as
long as the clock does. With tp_size > 1 the step time is the minimum of the ranks' clocks (one
all-reduce on the CPU group per step), and every decision of that step reads that value. Modes
that break these assumptions are refused at start-up (``modes.py``).
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
from typing import TYPE_CHECKING, Callable, Optional

from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS, AddReqResult, PrefillAdder

from sglang_continuum.adapter.metrics import kv_occupancy
from sglang_continuum.adapter.modes import check_supported
from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
from sglang_continuum.adapter.request import get_tag
from sglang_continuum.adapter.runtime import ContinuumRuntime
from sglang_continuum.adapter.schedule_policy import KEY_ATTR, ContinuumSchedulePolicy
from sglang_continuum.adapter.tool_identifier import make_identifier
from sglang_continuum.core.bounded_waiting import MIN_OVERTAKES
from sglang_continuum.core.priority import NEW

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

MAX_ADMISSION_RETRIES = 4  # re-runs of SGLang's prefill selection per step after shedding
_NO_KEY = (None,)  # a request the queue order has not placed (no program seen yet)


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


def _batch_mode(batch) -> Optional[bool]:
    """What ran since the last iteration: True a decode batch, False a prefill (or mixed) one, None
    nothing (the engine's time then is not the batch's)."""
    if batch is None or batch.forward_mode is None or batch.is_empty():
        return None
    return bool(batch.forward_mode.is_decode())


def _prefilled(batch, loaded: int = 0) -> tuple[int, int, int]:
    """What a prefill (or mixed) batch computed: its new tokens, the token pairs its attention did
    (``e^2 + 2ep`` per request: ``e`` new tokens behind a cached prefix ``p``), and ``loaded``, the
    host tokens its selection loaded back, which the engine's prefill cost is fitted to."""
    if batch is None or batch.forward_mode is None or batch.forward_mode.is_decode() or not batch.extend_lens:
        return 0, 0, 0
    prefixes = batch.prefix_lens or [0] * len(batch.extend_lens)
    pairs = sum(e * (e + 2 * p) for e, p in zip(batch.extend_lens, prefixes))
    return int(sum(batch.extend_lens)), int(pairs), loaded


class Admission:
    """What one prefill selection learned and decided: the first turn SGLang's budget refused, and
    by how many tokens (the adder's own arithmetic); the programs whose turns it took; whether an
    overdue first turn is held at the door (then later first turns wait behind it)."""

    def __init__(self, scheduler: "Scheduler", cache: ContinuumRadixCache, policy: ContinuumSchedulePolicy) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.policy = policy
        self.blocked = None
        self.shortfall = 0
        self.candidate: Optional[int] = None  # the shortfall SGLang's selection just refused
        self.taken: set[str] = set()  # programs with a turn this selection took
        self.door_closed = False
        self._classes: dict[type, type] = {}

    def reset(self) -> None:
        self.blocked, self.shortfall, self.candidate = None, 0, None
        self.taken.clear()
        self.door_closed = False

    def adder_class(self, base: type[PrefillAdder]) -> type[PrefillAdder]:
        cls = self._classes.get(base)
        if cls is None:
            cls = self._classes[base] = self._make_adder_class(base)
        return cls

    def _make_adder_class(self, base: type[PrefillAdder]) -> type[PrefillAdder]:
        admission = self

        class ContinuumPrefillAdder(base):
            # what turns this selection took reserve in the working set: it learns of them only
            # once the batch is formed (``request_admitted``), and the door must not let a wave through
            continuum_pending_tokens = 0

            def add_one_req(self, req, has_chunked_req, truncation_align_size):
                if admission.hold_back(self, req):
                    if admission.ends_walk(self, req):
                        return AddReqResult.OTHER  # every turn behind it would be held too
                    return AddReqResult.CONTINUE  # skipped; later turns may still be admitted
                admission.candidate = None
                taken = len(self.can_run_list)
                result = super().add_one_req(req, has_chunked_req, truncation_align_size)
                committed = len(self.can_run_list) > taken  # then the result speaks of the next candidate
                if committed:
                    self.continuum_pending_tokens += admission.took(req)
                elif result is AddReqResult.NO_TOKEN and admission.blocked is None:
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
        controller = self.cache.controller
        held = controller.holds_back(
            tag,
            len(req.origin_input_ids),
            self.cache.admission_capacity_tokens(),
            idle=idle,
            pending_tokens=adder.continuum_pending_tokens,
            behind_overdue=self.door_closed,
        )
        if held and not self.door_closed and controller.is_overdue(tag):
            self.door_closed = True  # the room that opens is this turn's first: bounded waiting at the door
        return held

    def ends_walk(self, adder: PrefillAdder, req) -> bool:
        """``req`` was held: whether it is a first turn (``NEW``, the queue order's last class) behind
        which every turn waits too: no request the door never holds is behind it, and an overdue
        one closed the door or not even the shortest first turn waiting fits the room left."""
        key = getattr(req, KEY_ATTR, None) or _NO_KEY
        queue = self.scheduler.waiting_queue
        if key[0] != NEW or self.policy.exempt_behind(queue, key):
            return False
        if self.door_closed:
            return True
        shortest = self.policy.shortest_first_turn(queue)
        door, capacity = self.cache.controller.door, self.cache.admission_capacity_tokens()
        return shortest is not None and door.over_capacity(shortest, capacity, adder.continuum_pending_tokens)

    def took(self, req) -> int:
        """``req`` was taken into the selection: what it will reserve in the working set."""
        tag = get_tag(req)
        if tag is None:
            return 0
        if tag.meta.program_id is not None:
            self.taken.add(tag.meta.program_id)
        return self.cache.controller.admission_reservation(tag, len(req.origin_input_ids))


class SchedulerBinding:
    def __init__(self, scheduler: "Scheduler") -> None:
        check_supported(scheduler.server_args, hybrid_ssm=bool(getattr(scheduler, "is_hybrid_ssm", False)))
        cache = scheduler.tree_cache
        if not isinstance(cache, ContinuumRadixCache):
            raise RuntimeError(
                "--schedule-policy continuum is selected but the tree cache is "
                f"{type(cache).__name__}, not ContinuumRadixCache. Continuum needs SGLang's default "
                "unified radix cache (it is not compatible with --disable-radix-cache, "
                "--radix-cache-backend, LMCache, FlexKV or pure-SWA models)."
            )
        self.scheduler = scheduler
        self.cache = cache
        self.controller = cache.controller
        self.policy = ContinuumSchedulePolicy(
            cache,
            scheduler.enable_hierarchical_cache,
            scheduler.enable_priority_scheduling,
            scheduler.schedule_low_priority_values_first,
        )
        self.now = _consensus_now(scheduler, cache)
        # overlap scheduling on an asynchronous device launches a batch and goes on while it runs:
        # the time between two iterations is then the batch launched before the last one (on a
        # CPU, or without overlap, the last one: its forward returns when it is done)
        self.forward_is_async = bool(scheduler.enable_overlap) and getattr(scheduler, "device", "cpu") != "cpu"
        self._launched: tuple[Optional[bool], tuple[int, int, int]] = (None, (0, 0, 0))
        self._loaded = 0  # host tokens the last selection loaded back for the batch it made
        self.admission = Admission(scheduler, cache, self.policy)
        self._waiting_programs: Optional[set[str]] = None
        self._next_check = 0.0
        cache.identify_tool = make_identifier(
            getattr(scheduler, "tokenizer", None), getattr(scheduler.server_args, "tool_call_parser", None)
        )
        cache.program_waiting = self.program_waiting
        cache.runtime = ContinuumRuntime.start(  # the services, composed once per scheduler
            cache.settings,
            cache.controller,
            cache.step_clock,
            **cache.ranks._asdict(),
            host_tier=cache.host_tier is not None,
            single_shot=cache.single_shot,
        )
        cache.program_taken = self.admission.taken.__contains__
        cache.runtime.occupancy = self.kv_occupancy  # refreshed with the other gauges
        self._sglang = {
            name: getattr(scheduler, name)
            for name in (
                "_add_request_to_queue",
                "get_next_batch_to_run",
                "get_new_batch_prefill",
                "get_prefill_adder_class",
                "on_idle",
            )
        }
        for name in self._sglang:
            setattr(scheduler, name, getattr(self, name))

    # -- state the hooks share -------------------------------------------------------------
    def program_waiting(self, pid: str) -> bool:
        """Whether ``pid`` has a turn waiting, or taken by the selection under way (its pin is a
        certain hit: shedding it frees nothing its own turn does not hold)."""
        if pid in self.admission.taken:
            return True
        if self._waiting_programs is None:  # built at most once per step, and only if asked
            self._waiting_programs = {
                tag.meta.program_id
                for tag in map(get_tag, self.scheduler.waiting_queue)
                if tag is not None and tag.meta.program_id is not None
            }
        return pid in self._waiting_programs

    def live_reqs(self) -> list:
        """The requests SGLang holds: waiting, running, being prefilled in chunks, or in the last
        prefill batch (merged into the running batch at the next step)."""
        s = self.scheduler
        reqs = [*s.waiting_queue, *s.running_batch.reqs]
        if s.last_batch is not None:
            reqs += s.last_batch.reqs
        if s.chunked_req is not None:
            reqs.append(s.chunked_req)
        return reqs

    def live_rids(self) -> set[str]:
        """The live requests not yet finished (a finished one left: SGLang filters it next step)."""
        return {r.rid for r in self.live_reqs() if not r.finished()}

    def kv_occupancy(self) -> dict[str, int]:
        """The KV pool as SGLang's token_usage counts it, with what only pins hold set apart."""
        return kv_occupancy(self.scheduler.pool_stats_observer.get_pool_stats(), self.cache, self.live_reqs())

    # -- the hooks ----------------------------------------------------------------------------
    def _add_request_to_queue(self, req, is_retracted: bool = False):
        s = self.scheduler
        if not s.waiting_queue and s.running_batch.is_empty():
            # It reaches an idle scheduler: the step clock was last set before the loop went idle
            # (with --sleep-on-idle up to a poll ago), so refresh it, or the arrival, and the tool
            # time it measures, is stamped early. Every rank ingests the same requests in the same
            # order while equally idle, so the consensus read pairs up across ranks.
            self.cache.step_clock.set(self.now())
        result = self._sglang["_add_request_to_queue"](req, is_retracted=is_retracted)
        if s.waiting_queue and s.waiting_queue[-1] is req:  # appended: not rejected at the door
            self.cache.request_queued(req, waiting_ahead=len(s.waiting_queue) - 1)
            self.policy.requeued(req)
        return result

    def get_prefill_adder_class(self):
        return self.admission.adder_class(self._sglang["get_prefill_adder_class"]())

    def get_new_batch_prefill(self, running_batch):
        new_prefill, cache, admission = self._sglang["get_new_batch_prefill"], self.cache, self.admission
        admission.reset()
        plan = self._admitted(new_prefill(running_batch))
        for _ in range(MAX_ADMISSION_RETRIES):
            blocked = admission.blocked
            if blocked is None or not len(self.controller.pins):
                break
            idle = plan.batch_to_run is None and plan.running_batch.is_empty()
            tag = get_tag(blocked)
            reason = "idle" if idle else "hold_bound" if tag is not None and tag.due else "admission"
            shed = cache.shed_for(
                tag,
                tokens=admission.shortfall,
                reason=reason,
                program_waiting=self.program_waiting,
                request_tokens=len(blocked.origin_input_ids),
            )
            if not shed:
                break
            plan.running_batch.batch_is_full = False  # memory came back: admission is open again
            if plan.batch_to_run is not None:
                break  # others were admitted this step; the blocked turn gets the memory next step
            admission.reset()
            plan = self._admitted(new_prefill(plan.running_batch))
        return plan

    def _admitted(self, plan):
        """The turns the selection took hold their prefix now: they consume their pins before
        anything is shed for a turn the same selection refused."""
        if plan.batch_to_run is not None:
            self._loaded = sum(self.cache.request_admitted(req) for req in plan.batch_to_run.reqs)
        return plan

    def get_next_batch_to_run(self, running_batch, last_batch):
        self._waiting_programs = None
        ran, prefilled = _batch_mode(last_batch), _prefilled(last_batch, self._loaded)
        self._loaded = 0  # a selection below (if any) is the next batch's
        if self.forward_is_async:
            (ran, prefilled), self._launched = self._launched, (ran, prefilled)
        room, contended = self._upload_room()
        if self.cache.step(
            self.now(), self.program_waiting, ran=ran, prefilled=prefilled, room_tokens=room, contended=contended
        ):
            # memory given back outside a request's exit: SGLang clears batch_is_full only
            # when a running request leaves, so re-open admission here
            running_batch.batch_is_full = False
        plan = self._sglang["get_next_batch_to_run"](running_batch=running_batch, last_batch=last_batch)
        self.cache.runtime.publish_metrics(self.scheduler.waiting_queue)
        return plan

    def _upload_room(self) -> tuple[int, bool]:
        """What a predictive upload may fill (``core/upload.py``): half of the device memory free or
        held only by unlocked cache (the rest stays for what runs and arrives), none while the last
        selection refused a turn for memory; and whether turns wait (holding memory then has a price)."""
        s = self.scheduler
        if self.cache.host_tier is None or self.admission.blocked is not None:
            return 0, bool(s.waiting_queue)
        room = (s.token_to_kv_pool_allocator.available_size() + self.cache.evictable_size()) // 2
        return room, bool(s.waiting_queue)

    def on_idle(self):
        s, cache = self.scheduler, self.cache
        runtime = cache.runtime
        runtime.exchange_stats(cache.step_clock.read_source())  # an idle worker still shares and learns
        runtime.publish_metrics(s.waiting_queue, force=True)  # the last step's changes reach /metrics
        if runtime.event_log is not None:
            runtime.event_log.flush()
        if len(cache.lifecycle) and not s.waiting_queue and s.is_fully_idle():
            if cache.settings.check_integrity:
                cache.lifecycle.check_integrity(set())  # a request SGLang let go unseen: report it
            cache.forget_stale()
        now = cache.step_clock.read_source()
        if cache.settings.check_integrity and now >= self._next_check and s.is_fully_idle():
            self._next_check = now + 1.0  # the idle loop spins: once a second is plenty
            cache.check_integrity(self.live_rids())
            assert not any(p.in_flight for p in self.controller.programs), "a program in flight on an idle server"
        return self._sglang["on_idle"]()


def install(scheduler: "Scheduler") -> ContinuumSchedulePolicy:
    binding = SchedulerBinding(scheduler)
    _save_stats_on_sigterm(binding.cache)
    settings, controller = binding.cache.settings, binding.controller
    logger.info(
        "continuum: active (rules %s, ttl model %s, pin budget %d tokens, overdue after %d overtakes (down to %d "
        "as the pool thrashes), admission control %s)",
        controller.rules.name,
        controller.ttl_model.name,
        controller.pins.budget_tokens,
        settings.max_overtakes,
        min(MIN_OVERTAKES, settings.max_overtakes),
        "on" if settings.admission_control else "off",
    )
    binding.policy.binding = binding  # read by tests: the last selection's admission record
    return binding.policy


def _save_stats_on_sigterm(cache: ContinuumRadixCache) -> None:
    """Save statistics whenever the scheduler process stops: a graceful exit (SIGTERM to the
    launcher sends the schedulers a ``ShutdownReq``; they leave their loop and the interpreter
    exits, running ``atexit``), or a SIGTERM to the process itself (a process-group SIGTERM, and
    the launcher's wrapped ``kill_process_tree``, see ``plugin.py``), after which it stops as
    SIGTERM would have."""
    runtime = cache.runtime
    if runtime.saver is None:
        return
    atexit.register(runtime.save_stats_now)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        runtime.save_stats_now()
        signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
