"""``ContinuumRadixCache``: SGLang's ``UnifiedRadixCache`` with TTL pins.

A pin is an ordinary tree lock (``lock(req.last_node)``) taken when a checkpointed, non-final
turn is released, and owned by the controller's pin table. Because it is a lock, the pinned
prefix is protected (not evictable, not counted as admission budget) by SGLang's own machinery,
and giving it back is an ``unlock``. The pin is taken in ``on_release`` right after the
request's own lock is dropped, in the same call, so the prefix is never unprotected in between;
it is consumed once the program's next turn is admitted, holding its own lock on the prefix.

This class executes what the controller decides; it never edits the controller's tables.

With HiCache (``--enable-hierarchical-cache``) a pin that expires or is shed before its program
returns is offloaded: its path is backed up to host if it is not already, its host copy is
host-locked for a host TTL (a host pin), and only then is the device lock dropped. The returning
turn then loads the prefix back instead of recomputing it. See ``host_tier.py``.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
from sglang.srt.environ import envs
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, CacheRequestOutcome, EvictParams, EvictResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import match_kv_cache
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs

from sglang_continuum.adapter.host_tier import HostTier
from sglang_continuum.adapter.inference import ProgramInference, is_inferred
from sglang_continuum.adapter.lifecycle import RequestLifecycle
from sglang_continuum.adapter.metrics import ContinuumMetrics
from sglang_continuum.adapter.request import context_tokens, get_tag, read_program_meta, set_tag
from sglang_continuum.core.clock import Clock, StepClock, default_clock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.cost_model import PrefillProfile
from sglang_continuum.core.event_log import EventLog
from sglang_continuum.core.metadata import MalformedReporter, ProgramMeta
from sglang_continuum.core.offload import HOST_PIN_BUDGET_FRACTION
from sglang_continuum.core.persistence import StatsSaver, load_stats
from sglang_continuum.core.pins import Pin, Tier
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.stats_endpoints import rank_endpoint, read_keys
from sglang_continuum.core.stats_exchange import StatsExchange
from sglang_continuum.core.turns import StepPlan, TurnTag

logger = logging.getLogger(__name__)

METRICS_INTERVAL_S = 0.5  # queue-scanning gauges are recomputed at most this often

# Identifies the tool a finished turn called: (req) -> tool name or None. Set by the binding.
ToolIdentifier = Callable[[Req], Optional[str]]


class ContinuumRadixCache(UnifiedRadixCache):
    def __init__(
        self,
        params: CacheInitParams,
        *,
        settings: Optional[ContinuumSettings] = None,
        clock: Optional[Clock] = None,
    ) -> None:
        self.controller: Optional[ContinuumController] = None  # reset() runs inside super().__init__
        self.host_tier: Optional[HostTier] = None  # set by init_hicache
        # whether a program has a turn in the waiting queue (set by the binding; None: unknown)
        self.program_waiting: Optional[Callable[[str], bool]] = None
        # whether the prefill selection under way took a turn of a program (set by the binding)
        self.program_taken: Optional[Callable[[str], bool]] = None
        self.lifecycle = RequestLifecycle()  # SGLang's live requests that the plugin has seen
        super().__init__(params)
        self.settings = settings or ContinuumSettings.load()
        # SGLang builds this class as cache_class(params): the clock comes from the seam
        # (core.clock.use_clock) so tests and the emulator can run the real scheduler on theirs.
        self.step_clock = StepClock(clock or default_clock())
        budget = int(self.token_to_kv_pool_allocator.size * self.settings.pin_budget_fraction)
        self.controller = ContinuumController(self.settings, clock=self.step_clock, budget_tokens=budget)
        self.report_malformed = MalformedReporter()
        tp_rank, tp_size = 0, 1
        if params.tp_cache_group is not None:
            import torch.distributed as dist

            tp_rank = dist.get_rank(group=params.tp_cache_group)
            tp_size = dist.get_world_size(group=params.tp_cache_group)
        self.metrics: Optional[ContinuumMetrics] = ContinuumMetrics(tp_rank=tp_rank) if params.enable_metrics else None
        self._next_metrics = 0.0
        self._oldest_wait = 0.0
        self._held_back = 0
        self.identify_tool: ToolIdentifier = lambda req: None
        self.saver: Optional[StatsSaver] = None
        if self.settings.stats_path:
            load_stats(self.controller, self.settings.stats_path)
            if tp_rank == 0 and params.pp_rank == 0:  # one writer per server
                self.saver = StatsSaver(self.settings.stats_path)
        self._next_stats_save = self.step_clock() + self.controller.timings.stats_save_interval_s
        self.event_log: Optional[EventLog] = None
        if self.settings.event_log and tp_rank == 0 and params.pp_rank == 0:
            self.event_log = EventLog(self.settings.event_log)
        self.exchange: Optional[StatsExchange] = self._start_exchange(tp_size)
        self.inference: Optional[ProgramInference] = (
            ProgramInference(
                self.controller.programs.__contains__,
                self.step_clock,
                event_log=self.event_log,
                single_shot=self._single_shot,
            )
            if self.settings.infer_programs
            else None
        )

    def _start_exchange(self, tp_size: int) -> Optional[StatsExchange]:
        """Tool statistics shared with peer workers, when endpoints are set. Only with one
        scheduler per server: tensor-parallel ranks must take identical pin decisions, and peers'
        samples would reach only the rank that receives them. Each data-parallel rank is a worker
        of its own, on an endpoint derived from the configured one (``rank_endpoint``)."""
        s = self.settings
        if not (s.stats_publish_endpoint or s.stats_peer_endpoints):
            return None
        if tp_size > 1:
            logger.warning("continuum: shared tool statistics are off: they need tp_size 1 (got %d)", tp_size)
            return None
        parallel = get_parallel()
        dp_rank, dp_size = parallel.dp_rank or 0, parallel.num_dp_ranks  # dp_rank None: no DP controller
        try:
            keys = read_keys(s.stats_key_file) if s.stats_key_file else None
            exchange = StatsExchange(
                s.stats_publish_endpoint, s.stats_peer_endpoints, keys=keys, dp_rank=dp_rank, dp_size=dp_size
            )
        except Exception as exc:  # e.g. the publish port is taken: serve on, with local statistics only
            logger.error("continuum: shared tool statistics are off: %s", exc)
            return None
        self.controller.share_sample = exchange.record
        logger.info(
            "continuum: sharing tool statistics (publish %s, %d peer endpoint(s), dp rank %d of %d, %s)",
            rank_endpoint(s.stats_publish_endpoint, dp_rank) if s.stats_publish_endpoint else "-",
            len(s.stats_peer_endpoints),
            dp_rank,
            dp_size,
            "CURVE keys" if keys else "this host only",
        )
        return exchange

    def exchange_stats(self, now: float) -> None:
        """Publish this worker's new tool samples and merge its peers' (non-blocking; between
        exchange intervals one comparison)."""
        if self.exchange is not None:
            samples = self.exchange.poll(now)
            if samples:
                self.controller.merge_peer_samples(samples)

    def init_hicache(self, server_args: ServerArgs, params: CacheInitParams) -> None:
        super().init_hicache(server_args, params)
        self.host_tier = HostTier.attach(self)
        if self.host_tier is None:
            return
        bandwidth = self.settings.host_bandwidth_bytes_per_s
        if bandwidth is None and self.settings.prefill_profile:
            # the cost model already loaded the profile; other TTL models did not
            profile = getattr(self.controller.ttl_model, "profile", None)
            if profile is None:
                profile = PrefillProfile.load(self.settings.prefill_profile)
            bandwidth = profile.host_bytes_per_s
        reload = self.host_tier.reload_cost(bandwidth)
        budget = int(self.host_tier.capacity_tokens * HOST_PIN_BUDGET_FRACTION)
        self.controller.attach_host_tier(reload=reload, host_budget_tokens=budget, hold_cost=self.host_tier.hold_cost)
        if self.metrics is not None:
            self.metrics.add_host_series()
        logger.info(
            "continuum: HiCache host tier (write policy %s, %d host tokens, host pin budget %d, "
            "reload %.0f MB/s at %d bytes/token, offload %s)",
            self.host_tier.write_policy,
            self.host_tier.capacity_tokens,
            budget,
            reload.bytes_per_s / 1e6,
            reload.bytes_per_token,
            "on" if self.settings.offload_to_host else "off",
        )

    def admission_capacity_tokens(self) -> int:
        """What admission control fits the working set into: the device pool, or with HiCache
        what the two tiers hold together (a program out on a tool waits on host, and comes back
        with a load instead of a re-prefill)."""
        if self.host_tier is not None:
            return self.host_tier.distinct_capacity_tokens
        return int(self.token_to_kv_pool_allocator.size)

    # -- request lifecycle (adapter/lifecycle.py) ---------------------------------------
    def request_queued(self, req: Req, *, waiting_ahead: int = 0) -> TurnTag:
        """``req`` is in SGLang's waiting queue now, behind ``waiting_ahead`` requests: a turn
        arrived, or a retracted one is back."""
        live = self.lifecycle.get(req.rid)
        if live is not None:
            self.lifecycle.requeued(req.rid)
            self.controller.turn_requeued(live.tag, waiting_ahead=waiting_ahead)
            return live.tag
        if _aborted(req):
            # SGLang aborted it before it could run (prompt over the pool's limit, session not
            # found, ...): an error on its way to the client, nobody's turn and never held back
            meta = ProgramMeta()
        else:
            meta = read_program_meta(req, self.report_malformed)
        # SGLang's own health probes (/health_generate) are nobody's turn: never remembered
        if not meta.has_program and self.inference is not None and not req.rid.startswith(HEALTH_CHECK_RID_PREFIX):
            meta = self.inference.attribute(req)
        tag = self.controller.turn_arrived(
            meta,
            waiting_ahead=waiting_ahead,
            prompt_tokens=len(req.origin_input_ids),
            cached_tokens=lambda: self._cached_on_arrival(req),
        )
        set_tag(req, tag)
        self.lifecycle.entered(req.rid, tag)
        return tag

    def _cached_on_arrival(self, req: Req) -> Optional[int]:
        """How much of ``req``'s prompt is cached (device and host) as it arrives: SGLang's own
        match, as its cache-aware policies run it for every waiting request."""
        try:
            found = match_kv_cache(req, self)
        except Exception:  # an order hint must never cost the request: it keeps its program's place
            logger.exception("continuum: prefix match on arrival failed for %s", req.rid)
            return None
        return int(found.device_prefix_len) + int(found.host_hit_length or 0)

    def request_admitted(self, req: Req) -> None:
        """``req`` was just taken into a prefill batch and holds its own lock on its prefix."""
        live = self.lifecycle.admitted(req.rid)
        if live is None:  # back after a retraction (admitted once already), or not ours
            return
        self.turn_admitted(
            live.tag,
            len(req.origin_input_ids),
            host_loaded=int(getattr(req, "host_loaded_length", 0) or 0),
            cached=int(getattr(req, "prefix_len", 0) or 0),
            probe=req.rid.startswith(HEALTH_CHECK_RID_PREFIX),
        )
        if self.event_log is not None:
            self.event_log.admitted(req.rid, self.step_clock(), self.controller.last_admission)

    def finish(self, handle: CacheRequestHandle, outcome: CacheRequestOutcome) -> None:
        super().finish(handle, outcome)
        if outcome is CacheRequestOutcome.ABORT:
            live = self.lifecycle.left(handle.rid)
            if live is not None:  # aborted while waiting (client gone, /abort_request), or a chunked request
                self.turn_aborted(live.tag.meta, live.tag)

    def claim_kv_row(self, req: Req) -> bool:
        """A streaming session (``--enable-streaming-session``) keeps a finished or retracted
        turn's KV row for its next turn, and SGLang then skips ``on_release``: the turn leaves
        here instead. Nothing is pinned for it: the session holds the KV."""
        claimed = super().claim_kv_row(req)
        if claimed and self.controller is not None:
            self._turn_left(req, checkpointed=True, node=None)
        return claimed

    def on_release(self, req: Req, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        if self.controller is not None:
            self._turn_left(req, checkpointed=checkpointed, node=req.last_node)

    def _turn_left(self, req: Req, *, checkpointed: bool, node) -> None:
        """``req`` gave its KV back (to the tree at ``node``, or to a session: None): it finished,
        was aborted, or was retracted and queues again."""
        aborted = _aborted(req)
        if not (req.finished() or aborted):  # retracted: it queues again; its pin must not hold memory meanwhile
            live = self.lifecycle.get(req.rid)
            if live is not None:
                self._release(self.controller.turn_retracted(live.tag))
            return
        live = self.lifecycle.left(req.rid)
        if live is None:
            return
        tag = live.tag
        done = checkpointed and not aborted
        if not tag.meta.has_program:
            if done and node is not None and self.inference is not None:
                self.inference.provisional_finished(req)  # its next turn, if any, makes it a program
            return
        if done:
            # decoding the output to find the tool is skipped when the client named it or no pin follows
            parse = not (tag.meta.tool_name or tag.meta.is_last_step)
            tool = self.identify_tool(req) if parse else None
            self.turn_finished(tag.meta, node, context_tokens(req), tool, tag=tag)
            if self.inference is not None and is_inferred(tag.meta):
                self.inference.turn_finished(tag.meta, req)
        else:
            self.turn_aborted(tag.meta, tag)

    def forget_stale(self) -> int:
        """With the scheduler fully idle nothing is live: a request still recorded left SGLang by a
        path that told the cache nothing. End it as aborted, so its program does not stay in flight
        (and tracked) for ever. Returns how many there were (0 unless SGLang grew such a path)."""
        stale = list(self.lifecycle)
        for rid, live in stale:
            self.lifecycle.left(rid)
            logger.warning("continuum: request %s left SGLang unseen; ended as aborted", rid)
            self.turn_aborted(live.tag.meta, live.tag)
        return len(stale)

    def turn_finished(
        self, meta: ProgramMeta, node, tokens: int, tool: Optional[str], *, tag: Optional[TurnTag] = None
    ) -> Optional[Pin]:
        """A turn's context is in the tree at ``node`` (``tokens`` long; None: a streaming session
        holds it): pin it or not."""
        handle = None if meta.is_last_step or node is None else self.lock(node)
        outcome = self.controller.turn_finished(meta, context_tokens=tokens, tool=tool, handle=handle, tag=tag)
        if outcome.pin is None and handle is not None:
            self.unlock(handle)
        if outcome.ttl is not None and self.metrics is not None:
            self.metrics.observe_ttl(outcome.ttl)
        for pin in outcome.release:  # other programs' pins pushed out of the budget may go to host
            self._release([pin], offload=pin.program_id != meta.program_id)
        return outcome.pin

    def turn_admitted(
        self, tag: TurnTag, context_tokens: int, *, host_loaded: int = 0, cached: int = 0, probe: bool = False
    ) -> None:
        """The turn holds its own lock on its prefix now: consume its program's pin (and host pin).
        ``cached`` is SGLang's ``prefix_len``, which by admission counts host-loaded tokens too;
        ``probe``: SGLang's own health probe."""
        self._release([self.controller.turn_admitted(tag, context_tokens, cached_tokens=cached, probe=probe)])
        if self.host_tier is not None:
            self._release(self.controller.host_returned(tag, host_loaded))

    def turn_aborted(self, meta: ProgramMeta, tag: Optional[TurnTag] = None) -> None:
        self._release(self.controller.turn_aborted(meta, tag))

    def end_program(self, program_id: str) -> None:
        self._release(self.controller.end_program(program_id))

    def _single_shot(self, program_id: str) -> None:
        """A first turn taken as a program (no id) was not continued: single-shot after all."""
        state = self.controller.programs.get(program_id)
        if state is not None and state.turns_arrived == 1 and state.in_flight == 0:
            self._release(self.controller.end_program(program_id, single_shot=True))

    def step(self, now: float, program_waiting: Callable[[str], bool]) -> bool:
        """Once per scheduler iteration: advance the clock and execute the controller's step plan
        (expiry, offload); hand statistics to the saver.
        Returns whether device memory was given back."""
        self.step_clock.set(now)
        plan = self.controller.step(program_waiting)
        freed = self._execute(plan)
        if self.inference is not None:
            pinned = self.controller.pins.pinned_tokens
            self.inference.expire()  # a first turn's pin goes once it is known single-shot
            freed |= self.controller.pins.pinned_tokens < pinned
        self.exchange_stats(now)
        if self.saver is not None and now >= self._next_stats_save:
            self._next_stats_save = now + self.controller.timings.stats_save_interval_s
            self.saver.submit(self.controller.snapshot())
        return freed

    def publish_metrics(self, waiting_queue, *, force: bool = False) -> None:
        """Refresh the Prometheus series (only values that changed are written): at most every
        ``METRICS_INTERVAL_S`` while serving, so a decode step pays nothing for them, and at
        every call with ``force`` (the idle loop: /metrics is current whenever the engine rests)."""
        if self.metrics is None:
            return
        now = self.step_clock()
        due = now >= self._next_metrics
        if not (due or force):
            return
        if due:
            self._next_metrics = now + METRICS_INTERVAL_S
            tags = [tag for tag in map(get_tag, waiting_queue) if tag is not None]
            self._oldest_wait = now - min(tag.arrival for tag in tags) if tags else 0.0
            programs = self.controller.programs
            self._held_back = sum(
                1
                for tag in tags
                if tag.held_back
                and (state := programs.get(tag.meta.program_id)) is not None
                and state.turns_admitted == 0
            )
        self.metrics.update(
            self.controller,
            self.saver,
            self.exchange,
            held_back=self._held_back,
            oldest_wait_s=self._oldest_wait,
        )

    def shed_for(
        self,
        tag: Optional[TurnTag],
        *,
        tokens: int,
        reason: str = "admission",
        program_waiting: Optional[Callable[[str], bool]] = None,
    ) -> int:
        """Shed pins (latest program first) worth at least ``tokens`` for the blocked turn
        ``tag``. ``reason`` "admission": only pins of programs ranked after it; "idle" (the
        engine would otherwise idle: the paper's deadlock rule): any rank. Never the turn's own
        program's pin, and never a pin whose program's next turn is already waiting
        (``program_waiting``: shedding it throws away a certain hit) -- except on the idle path
        once nothing else is left."""
        keep = tag.meta.program_id if tag is not None else None
        after = tag.program_rank if reason == "admission" and tag is not None else None
        spares = (program_waiting, None) if reason == "idle" else (program_waiting,)
        shed = 0
        while shed < max(1, tokens):
            pin = self.controller.shed(reason, ranked_after=after, keep=keep, spares=spares)
            if pin is None:
                break
            self._release([pin], offload=True, sync=True)
            shed += pin.tokens
        return shed

    def save_stats_now(self) -> None:
        """Synchronous save (shutdown paths); never raises."""
        if self.saver is not None:
            self.saver.flush(timeout_s=2.0)
            self.saver.save_now(self.controller.snapshot())

    def check_integrity(self, sglang_live: Optional[set[str]] = None) -> None:
        """The controller's invariants plus the engine facts behind them: the requests the plugin
        holds live are SGLang's (``sglang_live``, when the caller knows them) and each program's
        count of turns in flight is its live requests'; every device pin's prefix is resident and
        protected, every host pin's node is backed up on host."""
        self.controller.check_integrity()
        self.lifecycle.check_integrity(sglang_live)
        live = self.lifecycle.programs_in_flight()
        for state in self.controller.programs:
            assert state.in_flight == live.get(id(state), 0), (
                f"program {state.program_id}: {state.in_flight} turns in flight, {live.get(id(state), 0)} live"
            )
        if self.inference is not None:
            self.inference.check_integrity()
        if self.exchange is not None:
            self.exchange.check_integrity()
        tree = self.tree_core
        for pin in self.controller.pins:  # a locked node is never evicted from the device
            assert not tree.is_full_device_evicted(pin.handle.node), f"pinned prefix of {pin.program_id} evicted"
        for pin in self.controller.host.pins:
            assert pin.handle is None or tree.is_backuped(pin.handle.node), f"host pin of {pin.program_id} not on host"
        assert self.protected_size() >= (max((p.tokens for p in self.controller.pins), default=0)), "pins unprotected"
        if envs.SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK.get():
            # SGLang's own tree invariants (structure, leaf sets, lock counts, evictable/protected
            # sizes); its scheduler runs this only for hybrid SWA/SSM models, never for ours
            self.sanity_check()

    # -- SGLang hooks --------------------------------------------------------------------
    def evict_for_alloc(self, params: EvictParams, *, allocation_reclaim_satisfied=None) -> EvictResult:
        allocator = self.token_to_kv_pool_allocator
        target = allocator.available_size() + params.num_tokens
        result = super().evict_for_alloc(params, allocation_reclaim_satisfied=allocation_reclaim_satisfied)
        if self.controller is None or not len(self.controller.pins):
            return result

        def satisfied() -> bool:
            if allocation_reclaim_satisfied is not None:
                return allocation_reclaim_satisfied()
            return allocator.available_size() >= target

        # An allocation that cannot be served must never wait on a pin: shed (pins whose next turn
        # is not waiting first), then evict again. Never the pin of a turn the selection under way
        # took: it frees nothing that turn's own lock does not hold.
        while not satisfied():
            pin = self.controller.shed("alloc", spares=(self.program_waiting, self.program_taken))
            if pin is None:
                break
            self._release([pin], offload=True, sync=True)
            more = super().evict_for_alloc(
                EvictParams(
                    num_tokens=max(0, target - allocator.available_size()),
                    swa_num_tokens=params.swa_num_tokens,
                    mamba_num=params.mamba_num,
                ),
                allocation_reclaim_satisfied=allocation_reclaim_satisfied,
            )
            result.num_tokens_evicted += more.num_tokens_evicted
            result.swa_num_tokens_evicted += more.swa_num_tokens_evicted
            result.mamba_num_evicted += more.mamba_num_evicted
        return result

    def shutdown(self) -> None:
        self.save_stats_now()  # warm start for the next server
        if self.event_log is not None:
            self.event_log.close()
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None
        super().shutdown()

    def reset(self) -> None:
        # flush_cache rebuilds the tree: pins point at nodes that no longer exist, so the
        # controller drops them without unlocking (and counts them as flushed).
        if self.controller is not None:
            self.controller.reset()
        super().reset()

    # -- internals -----------------------------------------------------------------------
    def _execute(self, plan: StepPlan) -> bool:
        freed = bool(plan.expired or plan.released)
        self._release(plan.expired, offload=True)
        self._release(plan.released)
        self._release(plan.host_expired)
        return freed

    def _release(self, pins: Iterable[Optional[Pin]], *, offload: bool = False, sync: bool = False) -> None:
        """Give pins' locks back. ``offload``: the pins ended early (expiry, shedding), so with a
        host tier their prefix first gets a protected host copy (``sync`` when the device memory
        is needed at once)."""
        for pin in pins:
            if pin is None or pin.handle is None:
                continue
            if pin.tier is Tier.HOST:
                self.host_tier.host_unlock(pin.handle)
            else:
                if offload and self.host_tier is not None:
                    self._offload(pin, sync=sync)
                self.unlock(pin.handle)
            pin.handle = None

    def _offload(self, pin: Pin, *, sync: bool) -> None:
        outcome = self.controller.offload(pin)
        self._release(outcome.release)
        host = outcome.pin
        if host is None:
            return
        node = pin.handle.node
        try:
            lock = self.host_tier.host_lock(node) if self.host_tier.back_up(node, sync=sync) else None
        except Exception:  # never let the host tier take serving down: fall back to a plain release
            logger.exception("continuum: offloading program=%s failed; releasing without a host copy", pin.program_id)
            lock = None
        if lock is None:
            self.controller.host.offload_failed(host)
            return
        self.controller.host.offloaded(host, lock)
        logger.debug(
            "continuum: offloaded program=%s tokens=%d host_ttl=%.3fs", pin.program_id, pin.tokens, outcome.ttl
        )


def _aborted(req: Req) -> bool:
    return isinstance(req.finished_reason, FINISH_ABORT) or isinstance(getattr(req, "to_finish", None), FINISH_ABORT)
