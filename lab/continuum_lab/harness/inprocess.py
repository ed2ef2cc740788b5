"""SGLang's real ``Scheduler`` built and stepped in this process (tier-2 tests, the emulator).

Builds the scheduler exactly as ``run_scheduler_process`` does (plugins loaded, server args
resolved and published), then drives its loop by hand: ``get_next_batch_to_run`` ->
``run_batch`` -> ``process_batch_result``. Requests enter through ``handle_generate_request``
with a ``TokenizedGenerateReqInput``, as they would from the tokenizer manager. Outputs go to the
scheduler's own (unconnected) detokenizer socket and are read off the ``Req`` objects instead.
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


def build_scheduler(model_path: str, *, schedule_policy: str = "continuum", max_total_tokens: int = 2048, **kw):
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
        disable_overlap_schedule=True,
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
):
    """Hand a request to the scheduler as the tokenizer manager would; return its queued ``Req``
    (None if the scheduler did not queue it)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
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


class SchedulerDriver:
    def __init__(self, scheduler) -> None:
        self.s = scheduler
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
        )
        if req is not None:
            self.reqs[rid] = req
        return rid

    def step(self) -> bool:
        """One iteration of ``event_loop_normal``: run the next batch, or idle (SGLang's idle
        checks and sleep, Continuum's idle hooks); then SGLang's per-step pool check when
        ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY`` is set."""
        from sglang.srt.environ import envs

        s = self.s
        batch = select_batch(s)
        if batch is not None:
            if batch.forward_mode.is_extend():
                self.admitted.extend(r.rid for r in batch.reqs if r.rid not in self.admitted)
            result = s.run_batch(batch)
            s.process_batch_result(batch, result)
        else:
            s._sched_idled = True
            s.on_idle()
        s.last_batch = batch
        if envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY.get():
            s.invariant_checker.self_check_during_busy()
        return batch is not None

    def run_until_idle(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            busy = self.step()
            if not busy and not self.s.waiting_queue and self.s.running_batch.is_empty():
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
