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
from dataclasses import replace
from typing import Callable, Iterable, NamedTuple, Optional

from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
from sglang.srt.environ import envs
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, CacheRequestOutcome, EvictParams, EvictResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import match_kv_cache
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs

from sglang_continuum.adapter.host_tier import HostTier
from sglang_continuum.adapter.inference import is_inferred
from sglang_continuum.adapter.lifecycle import RequestLifecycle
from sglang_continuum.adapter.request import context_tokens, get_tag, read_program_meta, set_tag
from sglang_continuum.adapter.runtime import ContinuumRuntime
from sglang_continuum.core.clock import Clock, StepClock, default_clock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.cost_model import PrefillProfile
from sglang_continuum.core.metadata import MalformedReporter, ProgramMeta
from sglang_continuum.core.offload import HOST_PIN_BUDGET_FRACTION
from sglang_continuum.core.pins import Pin, Tier
from sglang_continuum.core.residency import RESIDENT_PIN_SHARE
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.turns import StepPlan, TurnTag

logger = logging.getLogger(__name__)


class CacheRanks(NamedTuple):
    """Where this scheduler's cache sits: its tensor- and pipeline-parallel ranks, and whether
    SGLang exports metrics (what the runtime's services need to know)."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    enable_metrics: bool


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
        self.reused_rids = 0  # requests that arrived under a live request's rid (served without a program)
        super().__init__(params)
        self.settings = settings or ContinuumSettings.load()
        # SGLang builds this class as cache_class(params): the clock comes from the seam
        # (core.clock.use_clock) so tests and the emulator can run the real scheduler on theirs.
        self.step_clock = StepClock(clock or default_clock())
        pool = self.token_to_kv_pool_allocator.size
        budget = int(pool * self.settings.pin_budget_fraction)
        ceiling = int(pool * RESIDENT_PIN_SHARE) if budget else 0  # no pins at all: none resident either
        self.controller = ContinuumController(
            self.settings, clock=self.step_clock, budget_tokens=budget, pin_ceiling_tokens=ceiling
        )
        self.report_malformed = MalformedReporter()
        tp_rank, tp_size = 0, 1
        if params.tp_cache_group is not None:
            import torch.distributed as dist

            tp_rank = dist.get_rank(group=params.tp_cache_group)
            tp_size = dist.get_world_size(group=params.tp_cache_group)
        self.ranks = CacheRanks(tp_rank, tp_size, params.pp_rank, bool(params.enable_metrics))
        self.identify_tool: ToolIdentifier = lambda req: None
        # statistics, event log, inference, metrics: off until the binding starts them
        self.runtime = ContinuumRuntime()

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
        self.controller.attach_host_tier(
            reload=reload, host_budget_tokens=budget, hold_cost=self.host_tier.hold_cost, learn_reload=bandwidth is None
        )
        logger.info(
            "continuum: HiCache host tier (write policy %s, %d host tokens, host pin budget %d, "
            "reload %s %.0f MB/s at %d bytes/token, offload %s)",
            self.host_tier.write_policy,
            self.host_tier.capacity_tokens,
            budget,
            "learned from the engine's loads, until then" if bandwidth is None else "at",
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
        if live is not None and get_tag(req) is live.tag:  # a retracted turn, queued again
            self.lifecycle.requeued(req.rid)
            self.controller.turn_requeued(live.tag, waiting_ahead=waiting_ahead)
            return live.tag
        if live is not None:
            # another request under the rid of one still live (rids are unique per tokenizer
            # manager, not across entry points): served as one without a program, untracked, so
            # that nothing of the live one's is touched
            self.reused_rids += 1
            log = logger.warning if self.reused_rids == 1 else logger.debug  # one line, not one per request
            log("continuum: request id %r reused while live; served without a program", req.rid[:64])
            tag = self.controller.turn_arrived(ProgramMeta(), waiting_ahead=waiting_ahead)
            set_tag(req, tag)
            return tag
        if _aborted(req):
            # SGLang aborted it before it could run (prompt over the pool's limit, session not
            # found, ...): an error on its way to the client, nobody's turn and never held back
            meta = ProgramMeta()
        else:
            meta = read_program_meta(req, self.report_malformed)
        # SGLang's own health probes (/health_generate) are nobody's turn: never remembered
        inference = self.runtime.inference
        if not meta.has_program and inference is not None and not req.rid.startswith(HEALTH_CHECK_RID_PREFIX):
            scope = meta.scope
            meta = inference.attribute(req, scope)
            if scope is not None:  # an inferred program is its sender's, for fair shares (``core/scopes.py``)
                meta = replace(meta, scope=scope)
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

    def request_admitted(self, req: Req) -> int:
        """``req`` was just taken into a prefill batch and holds its own lock on its prefix.
        Returns the tokens its admission loaded back from host (its batch waits on them)."""
        host_loaded = int(getattr(req, "host_loaded_length", 0) or 0)
        live = self.lifecycle.admitted(req.rid, get_tag(req))
        if live is None:  # back after a retraction (admitted once already), or not ours
            return 0
        self.turn_admitted(
            live.tag,
            len(req.origin_input_ids),
            host_loaded=host_loaded,
            cached=int(getattr(req, "prefix_len", 0) or 0),
            probe=req.rid.startswith(HEALTH_CHECK_RID_PREFIX),
        )
        if self.runtime.event_log is not None:
            self.runtime.event_log.admitted(req.rid, self.step_clock(), self.controller.last_admission)
        return host_loaded

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
            if live is not None and live.tag is get_tag(req):
                self._release(self.controller.turn_retracted(live.tag))
            return
        live = self.lifecycle.left(req.rid, get_tag(req))
        if live is None:
            return
        tag = live.tag
        done = checkpointed and not aborted
        inference = self.runtime.inference
        if not tag.meta.has_program:
            if done and node is not None and inference is not None:
                inference.provisional_finished(req)  # its next turn, if any, makes it a program
            return
        if done:
            # decoding the output to find the tool is skipped when the client named it or no pin follows
            parse = not (tag.meta.tool_name or tag.meta.is_last_step)
            tool = self.identify_tool(req) if parse else None
            self.turn_finished(tag.meta, node, context_tokens(req), tool, tag=tag)
            if inference is not None and is_inferred(tag.meta):
                inference.turn_finished(tag.meta, req)
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
        if outcome.ttl is not None and self.runtime.metrics is not None:
            self.runtime.metrics.observe_ttl(outcome.ttl)
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

    def single_shot(self, program_id: str) -> None:
        """A first turn taken as a program (no id) was not continued: single-shot after all."""
        state = self.controller.programs.get(program_id)
        if state is not None and state.turns_arrived == 1 and state.in_flight == 0:
            self._release(self.controller.end_program(program_id, single_shot=True))

    def step(
        self,
        now: float,
        program_waiting: Callable[[str], bool],
        *,
        ran: Optional[bool] = None,
        prefilled: tuple[int, ...] = (0, 0),
        room_tokens: int = 0,
        contended: bool = False,
    ) -> bool:
        """Once per scheduler iteration: advance the clock, tell the engine's timings what ran
        since the last one (``ran``: True decode, False a prefill, None nothing; ``prefilled``: its
        new tokens, attention pairs and tokens loaded from host) and execute the controller's step
        plan (expiry, offload); first turns known single-shot give their pins back; the runtime
        shares and saves statistics; with a host tier, host copies due back are uploaded into
        ``room_tokens`` of free device memory (``contended``: turns wait). Returns whether device
        memory was given back."""
        self.step_clock.set(now)
        self.controller.residency.engine.step(self.step_clock(), ran, prefilled)
        plan = self.controller.step(program_waiting, self.admission_capacity_tokens())
        freed = self._execute(plan)
        if self.host_tier is not None:  # host copies due back, each loaded under a lock that is its pin
            self._release(self.host_tier.upload(self.controller.uploads, now, room_tokens, contended))
        if self.runtime.inference is not None:
            pinned = self.controller.pins.pinned_tokens
            self.runtime.inference.expire()  # a first turn's pin goes once it is known single-shot
            freed |= self.controller.pins.pinned_tokens < pinned
        self.runtime.step(now)
        return freed

    def shed_for(
        self,
        tag: Optional[TurnTag],
        *,
        tokens: int,
        reason: str = "admission",
        program_waiting: Optional[Callable[[str], bool]] = None,
        request_tokens: int = 0,
    ) -> int:
        """Shed pins (latest program first) worth ``tokens`` for the blocked turn ``tag``: "admission",
        pins of programs ranked after it, then with a host tier those whose tool call leaves time
        to prefill its ``request_tokens`` and come back ("gap", ``core/upload.py``); "idle" (the
        paper's deadlock rule) and "hold_bound" (``residency.py``): any rank. Never its own
        program's pin, nor one whose next turn waits (``program_waiting``: a certain hit), but on
        the idle and bound paths once nothing else is left: a due turn goes ahead of that waiting
        return anyway, whose pin holds the room it waits for; a turn that keeps only part of its
        pinned context (a client that rewrote its history) may not fit beside the rest of it, and
        would otherwise wait out the pin's TTL on an idle engine."""
        keep = tag.meta.program_id if tag is not None else None
        after = tag.program_rank if reason == "admission" and tag is not None else None
        spares = (program_waiting, None) if reason in ("idle", "hold_bound") else (program_waiting,)
        shed = self._shed(tokens, reason, after, keep, spares)
        if shed < max(1, tokens) and reason == "idle" and keep is not None:
            shed += self._shed(tokens - shed, reason, None, None, (None,))  # only its own pins are left
        if shed < max(1, tokens) and reason == "admission" and self.host_tier is not None and request_tokens > 0:
            gap = self.controller.uploads.gap_spare(request_tokens, self.step_clock())
            shed += self._shed(tokens - shed, "gap", None, keep, (gap,))
        return shed

    def _shed(self, tokens: int, reason: str, after: Optional[int], keep: Optional[str], spares) -> int:
        shed = 0
        while shed < max(1, tokens):
            pin = self.controller.shed(reason, ranked_after=after, keep=keep, spares=spares)
            if pin is None:
                break
            self._release([pin], offload=True, sync=True)
            shed += pin.tokens
        return shed

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
        self.runtime.check_integrity()
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
        self.runtime.close()
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
