"""SGLang's real ``Scheduler`` built and stepped in this process (tier-2 tests, the emulator).

Builds the scheduler exactly as ``run_scheduler_process`` does (plugins loaded, server args
resolved and published), then drives its loop by hand, in the order of SGLang's own loops:
``event_loop_normal`` (``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``) or,
with overlap scheduling (a server's default), ``event_loop_overlap`` (select and launch the next
batch, then process the results of the one launched before it). Requests enter through
``handle_generate_request`` with a ``TokenizedGenerateReqInput``, as they would from the tokenizer
manager. Outputs go to the scheduler's own (unconnected) detokenizer socket and are read off the
``Req`` objects instead.
"""

from __future__ import annotations

import os
import uuid
from array import array
from typing import Optional, Sequence

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def construct_scheduler(server_args):
    """``Scheduler(server_args, ...)`` as ``run_scheduler_process`` builds it (plugins first)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs

    server_args.resolve_once()
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    return Scheduler(server_args, port_args)


def build_scheduler(
    model_path: str, *, schedule_policy: str = "continuum", max_total_tokens: int = 2048, overlap: bool = False, **kw
):
    """``overlap``: SGLang's overlap scheduling, as a server runs by default (the tests step the
    serial loop unless they ask for it)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()  # before ServerArgs: the plugin adds its schedule policy
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=model_path,
        device="cpu",
        attention_backend="torch_native",
        max_total_tokens=max_total_tokens,
        schedule_policy=schedule_policy,
        skip_server_warmup=True,
        disable_overlap_schedule=not overlap,
        enable_cache_report=True,
        log_level="warning",
        **kw,
    )
    return construct_scheduler(args)


def submit_request(
    scheduler,
    rid: str,
    input_ids: Sequence[int],
    *,
    max_new_tokens: int,
    custom_params: Optional[dict] = None,
    session_id: Optional[str] = None,
    routing_key: Optional[str] = None,
    session: Optional[str] = None,
):
    """Hand a request to the scheduler as the tokenizer manager would; return its queued ``Req``
    (None if the scheduler did not queue it). ``session``: a turn of the session opened under
    that id (``session_params``), its prompt appended to the session's context."""
    from sglang.srt.managers.io_struct import SessionParams, TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, custom_params=custom_params)
    sp.normalize(None)
    sp.verify(scheduler.model_config.vocab_size)
    scheduler.handle_generate_request(
        TokenizedGenerateReqInput(
            rid=rid,
            input_text=None,
            input_ids=array("q", input_ids),
            input_embeds=None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=sp,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
            session_id=session_id,
            session_params=SessionParams(id=session) if session is not None else None,
            routing_key=routing_key,
        )
    )
    for req in reversed(scheduler.waiting_queue):
        if req.rid == rid:
            return req
    return None


def select_batch(scheduler):
    """The scheduler's next batch (None: nothing to run), its running batch updated."""
    plan = scheduler.get_next_batch_to_run(running_batch=scheduler.running_batch, last_batch=scheduler.last_batch)
    scheduler.running_batch = plan.running_batch
    return plan.batch_to_run


def begin_loop(scheduler) -> bool:
    """What ``event_loop_overlap`` sets up before its first iteration (its queue of launched
    batches, skipping the decode of requests whose in-flight result finishes them); returns
    whether the scheduler overlaps."""
    if not scheduler.enable_overlap:
        return False
    if getattr(scheduler, "result_queue", None) is None:
        from collections import deque

        scheduler.result_queue = deque()
    scheduler.enable_skip_finishing_decode = True
    return True


def launch(scheduler, batch):
    """``run_batch``; returns what ``process`` needs once the forward is done: with overlap,
    a copy of the batch as SGLang queues it (the running batch changes under the next selection)."""
    result = scheduler.run_batch(batch)
    if not scheduler.enable_overlap:
        return batch, result
    scheduler.result_queue.append((batch.copy(), result))
    return scheduler.result_queue[-1]


def process(scheduler, launched) -> None:
    """``process_batch_result`` of a launched batch (with overlap, the oldest in flight)."""
    if scheduler.enable_overlap:
        queued = scheduler.result_queue.popleft()
        assert queued[0] is launched[0], "results processed out of launch order"
    scheduler.process_batch_result(*launched)


def processes_before_launch(scheduler, batch) -> bool:
    """SGLang processes the last batch's results before launching this one (two prefills in a
    row with ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP``; grammar syncs)."""
    return bool(scheduler.is_disable_overlap_for_batch(batch, last_batch=scheduler.last_batch))


def end_iteration(scheduler, batch, launched, *, idle: bool) -> None:
    """The tail of an ``event_loop_overlap`` / ``event_loop_normal`` iteration: idle hooks
    (SGLang's self-check, Continuum's ``on_idle``) when nothing ran or is in flight, a delayed
    sample of the batch just launched, ``last_batch``, the strict per-step pool check when its
    switch is set."""
    from sglang.srt.environ import envs

    if idle:
        scheduler._sched_idled = True
        scheduler.on_idle()
    if launched is not None and scheduler.enable_overlap:
        scheduler.launch_batch_sample_if_needed(launched[1], batch)
    scheduler.last_batch = batch
    if envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY.get():
        scheduler.invariant_checker.self_check_during_busy()


class SchedulerDriver:
    def __init__(self, scheduler) -> None:
        self.s = scheduler
        self.overlap = begin_loop(scheduler)
        self.in_flight = None  # with overlap: the batch launched last, its results not processed yet
        self.reqs: dict[str, object] = {}
        self.admitted: list[str] = []  # rids in the order prefill batches took them

    def submit(
        self,
        input_ids,
        *,
        max_new_tokens: int = 4,
        custom_params: Optional[dict] = None,
        session_id: Optional[str] = None,
        routing_key: Optional[str] = None,
        rid: Optional[str] = None,
        session: Optional[str] = None,
    ) -> str:
        rid = rid or uuid.uuid4().hex
        req = submit_request(
            self.s,
            rid,
            input_ids,
            max_new_tokens=max_new_tokens,
            custom_params=custom_params,
            session_id=session_id,
            routing_key=routing_key,
            session=session,
        )
        if req is not None:
            self.reqs[rid] = req
        return rid

    def step(self) -> bool:
        """One iteration of SGLang's loop (``event_loop_overlap`` when the scheduler overlaps,
        else ``event_loop_normal``): select a batch and run it, or idle (SGLang's idle checks,
        Continuum's idle hooks); with overlap the batch launched before this one is processed
        after the launch. Then SGLang's per-step pool check when
        ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY`` is set. True: a batch was launched."""
        s = self.s
        batch = select_batch(s)
        launched = None
        if batch is not None:
            if self.in_flight is not None and processes_before_launch(s, batch):
                process(s, self.in_flight)
                self.in_flight = None
            if batch.forward_mode.is_extend():
                self.admitted.extend(r.rid for r in batch.reqs if r.rid not in self.admitted)
            launched = launch(s, batch)
        idle = batch is None and self.in_flight is None
        if self.in_flight is not None:
            process(s, self.in_flight)
        if launched is not None and not self.overlap:
            process(s, launched)
        end_iteration(s, batch, launched, idle=idle)
        self.in_flight = launched if self.overlap else None
        return batch is not None

    def run_until_idle(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            busy = self.step()
            if not busy and self.in_flight is None and not self.s.waiting_queue and self.s.running_batch.is_empty():
                return
        raise TimeoutError("scheduler did not go idle")

    def req(self, rid: str):
        return self.reqs[rid]

    def output_ids(self, rid: str) -> list[int]:
        return list(self.reqs[rid].output_ids)


def release_parallel_runtime() -> None:
    """Undo the process-wide parallel runtime a built scheduler brought up (SGLang builds it once
    per process), so that another module's tests can build a scheduler of their own."""
    from sglang.srt.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
