"""Every touch of SGLang internals the emulator makes, in one place.

The emulator runs SGLang 0.5.23's real ``Scheduler`` in this process: its waiting queue, policies
(stock and this plugin's), ``PrefillAdder`` admission, chunked prefill, retraction, the
``UnifiedRadixCache`` and the token allocator all run unchanged. Two things are replaced:

* **The model.** The scheduler serves an *accounting model*: a one-layer, one-KV-head Llama
  config (written to a temp dir, ``--load-format dummy``, no tokenizer) whose KV pool has exactly
  the requested number of token slots but 32 bytes per token (bf16), so the pool's *token accounting*
  is real while its tensors are tiny.
* **The forward.** ``model_worker.forward_batch_generation`` (the one call between the scheduler
  and the model) is swapped, on this scheduler instance only, for a function that computes
  nothing and returns one sampled token per request (:func:`output_token`: the same for every
  step of a request, different between requests, so that two samples of one prompt diverge at
  their first output as sampled ones do). What the step would have cost on the profiled GPU is
  read off the batch by :func:`describe_batch`.

Building, submitting and the scheduler loop's steps (select, launch, process, in the order of
SGLang's overlap or serial loop) are the in-process harness the tier-2 tests use
(``harness/inprocess.py``). The serving code (``sglang_continuum.adapter``) does not know this
module exists: it sees a scheduler, and the clock :func:`sglang_continuum.core.clock.use_clock`
gave it.
"""

from __future__ import annotations

import json
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from continuum_lab.harness.inprocess import construct_scheduler, submit_request

ACCOUNTING_VOCAB = 1024
OUTPUT_TOKENS = range(8, ACCOUNTING_VOCAB)  # emulated output tokens (never EOS: the accounting model's EOS is 2)
ACCOUNTING_MAX_POSITIONS = 1 << 20
ACCOUNTING_KV_BYTES_PER_TOKEN = 1 * 2 * 1 * 8 * 2  # layers x (K, V) x KV heads x head dim x bf16 (dtype auto)


def write_accounting_model(directory: Path) -> Path:
    """A config-only Llama whose KV per token is 1 layer x 2 (K, V) x 1 head x 8 dims x fp32."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": ACCOUNTING_VOCAB,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "max_position_embeddings": ACCOUNTING_MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def server_args_for(
    model_dir: Path, max_total_tokens: int, policy_flags: Sequence[str], extra_flags: Sequence[str] = ()
):
    """``ServerArgs`` from the same command-line flags a real server of this policy gets (overlap
    scheduling on, as in a server, unless they say ``--disable-overlap-schedule``)."""
    import argparse

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()  # as the launcher does before parsing: the plugin adds its schedule policy

    argv = [
        "--model-path",
        str(model_dir),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--max-total-tokens",
        str(max_total_tokens),
        "--context-length",
        str(min(ACCOUNTING_MAX_POSITIONS, max_total_tokens)),
        "--enable-cache-report",
        "--enable-metrics",
        "--skip-server-warmup",
        "--log-level",
        "warning",
        *policy_flags,
        *extra_flags,
    ]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv)), shlex.join(argv)


def build_scheduler(server_args):
    """The scheduler exactly as ``run_scheduler_process`` builds it, its forward replaced."""
    scheduler = construct_scheduler(server_args)
    _replace_forward(scheduler)
    return scheduler


def time_forwards_as_the_profiled_device(scheduler, latency) -> None:
    """The plugin times each batch by the scheduler loop's iterations, and which batch an interval
    belongs to depends on whether the device runs a forward asynchronously (``binding``'s
    ``forward_is_async``: not on ``--device cpu``). The emulated device is the profiled one, a GPU
    unless the profile says ``synchronous_forward``."""
    binding = getattr(scheduler.policy, "binding", None)
    if binding is not None:
        binding.forward_is_async = bool(scheduler.enable_overlap) and not latency.synchronous_forward


def output_token(rid: str) -> int:
    """Every token request ``rid`` generates: one per request, stable across runs and processes."""
    return OUTPUT_TOKENS[zlib.crc32(rid.encode()) % len(OUTPUT_TOKENS)]


def _replace_forward(scheduler) -> None:
    import torch
    from sglang.srt.managers.utils import GenerationBatchResult

    def forward_batch_generation(batch, *args, **kwargs):
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=torch.tensor([output_token(r.rid) for r in batch.reqs], dtype=torch.int64),
            can_run_cuda_graph=False,
        )

    worker = scheduler.model_worker
    worker.forward_batch_generation = forward_batch_generation  # this instance only


def hicache_flags(flags: Sequence[str], device_pool_tokens: int, kv_bytes_per_token: float) -> list[str]:
    """A server's HiCache flags for the accounting model: ``--hicache-size GB`` sizes the host
    pool in bytes of the *profiled* model's KV, which the accounting model's 32-byte tokens would
    turn into a pool (and an allocation here) thousands of times too large. The same host pool in
    tokens is ``--hicache-ratio`` = host bytes / device pool bytes."""
    out = list(flags)
    if "--hicache-size" not in out:
        if "--hicache-ratio" not in out:
            # SGLang's default ratio, given explicitly: left unset, SGLang sizes the host pool from
            # this machine's free memory (after a 10 GiB reserve), which is not the emulated GPU
            # host's and can refuse to start when other processes hold memory
            out += ["--hicache-ratio", "2.0"]
        return out
    i = out.index("--hicache-size")
    gb = float(out[i + 1])
    del out[i : i + 2]
    if gb > 0:
        while "--hicache-ratio" in out:
            j = out.index("--hicache-ratio")
            del out[j : j + 2]
        out += ["--hicache-ratio", repr(gb * 1e9 / (device_pool_tokens * kv_bytes_per_token))]
    return out


@dataclass
class HostTransfers:
    """Tokens HiCache moved between host and device, counted where SGLang queues the copies."""

    loaded_tokens: int = 0  # host -> device (load back, predictive reload)
    written_tokens: int = 0  # device -> host (write-through, write-back, Continuum's offload)
    unbilled_loaded: int = 0  # loaded since the clock last charged them to a step

    def take_unbilled(self) -> int:
        n, self.unbilled_loaded = self.unbilled_loaded, 0
        return n


def count_host_transfers(scheduler) -> HostTransfers | None:
    """Wrap this scheduler's HiCache controller's ``load`` and ``write`` (the two calls through
    which every host<->device copy is queued) to count the tokens they move; None without
    HiCache."""
    controller = getattr(scheduler.tree_cache, "cache_controller", None)
    if controller is None:
        return None
    counts = HostTransfers()
    load, write = controller.load, controller.write

    def counted_load(host_indices, *args, **kwargs):
        device_indices = load(host_indices, *args, **kwargs)
        if device_indices is not None:
            counts.loaded_tokens += len(host_indices)
            counts.unbilled_loaded += len(host_indices)
        return device_indices

    def counted_write(device_indices, *args, **kwargs):
        host_indices = write(device_indices, *args, **kwargs)
        if host_indices is not None:
            counts.written_tokens += len(device_indices)
        return host_indices

    controller.load = counted_load  # this instance only
    controller.write = counted_write
    return counts


def host_pool_bytes_per_token(scheduler) -> int:
    return int(scheduler.tree_cache.cache_controller.mem_pool_host.anchor_entry.host_pool.size_per_token)


def host_pool_tokens(scheduler) -> int:
    return int(scheduler.tree_cache.cache_controller.mem_pool_host.size)


@dataclass(frozen=True)
class BatchShape:
    """What a forward's cost depends on."""

    is_prefill: bool
    extends: tuple[tuple[int, int], ...] = ()  # (new tokens, cached prefix) per request
    batch_size: int = 0
    context_tokens: int = 0  # decode: sum of the running requests' lengths


def describe_batch(batch) -> BatchShape:
    mode = batch.forward_mode
    if mode.is_extend():
        return BatchShape(True, tuple(zip(batch.extend_lens, batch.prefix_lens)), len(batch.reqs))
    if mode.is_decode():
        # the batch's own lengths: with overlap a request's last token is still in flight when
        # the next decode is built, so ``Req.seqlen`` lags the KV that forward reads by one
        return BatchShape(False, (), len(batch.reqs), int(batch.seq_lens_cpu.sum()))
    raise NotImplementedError(f"the emulator models extend and decode batches, not {mode}")


def submit(
    scheduler, rid: str, input_ids: Sequence[int], max_new_tokens: int, custom_params, session_id, routing_key=None
):
    """Queue a request as the tokenizer manager would; return its ``Req``."""
    req = submit_request(
        scheduler,
        rid,
        input_ids,
        max_new_tokens=max_new_tokens,
        custom_params=custom_params,
        session_id=session_id,
        routing_key=routing_key,
    )
    if req is None:
        raise RuntimeError(f"request {rid} was not queued (rejected by the scheduler?)")
    return req


def abort_message(req) -> str | None:
    """Why SGLang aborted this request (e.g. input longer than the context), or None. A server
    answers such a request with an error; the emulator's client must see one too."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    reason = req.finished_reason
    return reason.message if isinstance(reason, FINISH_ABORT) else None


def abort(scheduler, rid: str) -> None:
    """Abort ``rid`` as SGLang does when its client disconnects: the tokenizer manager sends the
    scheduler an ``AbortReq`` (``TokenizerManager.abort_request``), which ``Scheduler.abort_request``
    serves: a queued request leaves the waiting queue, a running one is marked ``to_finish`` (one
    more forward, then freed as finished), a chunked prefill stops at the next step. SGLang matches
    every rid that starts with ``rid``. A /generate stream's disconnect aborts at once; /v1's
    endpoints, still waiting for the first chunk, notice within ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``
    (4 s): the emulator aborts at once."""
    from sglang.srt.managers.io_struct import AbortReq

    scheduler.abort_request(AbortReq(rid=rid))


def close_session(scheduler, session_id: str) -> None:
    from sglang.srt.managers.io_struct import CloseSessionReqInput

    scheduler.close_session(CloseSessionReqInput(session_id=session_id))


def is_idle(scheduler) -> bool:
    return not scheduler.waiting_queue and scheduler.running_batch.is_empty() and scheduler.chunked_req is None


def pool_accounting(scheduler) -> dict:
    """Token slots of the KV pool by state, for the end-of-run leak check."""
    cache = scheduler.tree_cache
    allocator = scheduler.token_to_kv_pool_allocator
    return {
        "total": int(scheduler.max_total_num_tokens),
        "available": int(allocator.available_size()),
        "evictable": int(cache.evictable_size()),
        "protected": int(cache.protected_size()),
    }
