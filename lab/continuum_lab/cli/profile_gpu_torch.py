#!/usr/bin/env python3
"""Profile a Llama-3.1-8B-shaped model on one CUDA GPU with plain PyTorch + transformers (no SGLang).

What it measures (everything goes to one JSON file, ``--out``):

* prefill: seconds for one forward of a single sequence of n tokens (``use_cache=False``,
  ``logits_to_keep=1``), median of ``--repeats`` after ``--warmup`` warm-ups, CUDA-synchronised;
* decode: seconds for one forward of one new token per sequence for a batch of B sequences that
  each have a KV cache of ``ctx`` tokens. Three ways: ``dynamic`` is transformers' stock
  ``DynamicCache`` (it grows by ``torch.cat``, so every step also copies the whole cache) and
  ``inplace`` is the same cache class with a preallocated buffer written in place (closer to a
  serving engine's KV pool); ``graph`` is ``inplace`` with the step captured once in a CUDA
  graph and replayed (no Python or launch overhead, as in a serving engine's decode). The caches
  hold random values; no prefill is run to fill them (the step's cost depends on shapes only);
* host->device bandwidth: a pinned host buffer of 64 KiB pages copied to the GPU, contiguous and
  as randomly chosen (scattered) pages, several ways (see ``measure_bandwidth``).

The weights are random bf16 created directly on the GPU from a ``LlamaConfig``; nothing is
downloaded. Attention is transformers' "sdpa" (PyTorch scaled_dot_product_attention), not
SGLang's FlashInfer/FA3 kernels, and only the ``graph`` decode runs under a CUDA graph.

    python3 lab/continuum_lab/cli/profile_gpu_torch.py --out h100.json

``--tiny --device cpu`` runs a toy-sized smoke test of the code paths on a CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, warmup: int, repeats: int, reset=None) -> list[float]:
    """Wall times of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones (``reset`` untimed, after each)."""
    times = []
    for i in range(warmup + repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        dt = time.perf_counter() - t0
        if reset is not None:
            reset()
        if i >= warmup:
            times.append(dt)
    return times


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def free_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- model


def llama_config(tiny: bool):
    from transformers import LlamaConfig

    if tiny:
        kw = dict(
            hidden_size=64,
            intermediate_size=224,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
        )
    else:  # Llama-3.1-8B's published shapes
        kw = dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
        )
    cfg = LlamaConfig(max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, **kw)
    # rope_theta moved into rope_parameters in transformers 5; set whichever this version reads
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = 500000.0
    else:
        cfg.rope_theta = 500000.0
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(cfg, device: str, dtype):
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation="sdpa")
    model.eval()
    p = next(model.parameters())
    return model, {
        "params": sum(x.numel() for x in model.parameters()),
        "dtype": str(p.dtype),
        "device": str(p.device),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }


# ------------------------------------------------------------------------------------------- prefill


def _prefill_step(model, ids):
    def step():
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return step


def measure_prefill(model, cfg, device, lengths, warmup, repeats, deadline) -> list[dict]:
    out = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for n in lengths:
        if time.perf_counter() > deadline:
            out.append({"tokens": n, "skipped": "time budget"})
            log(f"prefill {n}: skipped (time budget)")
            continue
        ids = torch.randint(5, cfg.vocab_size, (1, n), generator=gen).to(device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()

        try:
            times = timed(_prefill_step(model, ids), device, warmup, repeats)
        except Exception as exc:  # noqa: BLE001
            if not is_oom(exc):
                raise
            out.append({"tokens": n, "skipped": "out of memory"})
            log(f"prefill {n}: out of memory, skipped")
            del ids
            free_memory(device)
            continue
        med = statistics.median(times)
        row = {"tokens": n, "median_s": med, "times_s": times, "tokens_per_s": n / med}
        if device.startswith("cuda"):
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out.append(row)
        log(f"prefill {n:>6} tokens: {med * 1000:9.1f} ms ({n / med:,.0f} tok/s)")
        del ids
        free_memory(device)
    return out


# -------------------------------------------------------------------------------------------- decode


def _inplace_layer_class():
    from transformers.cache_utils import DynamicLayer

    class InplaceLayer(DynamicLayer):
        """A DynamicLayer over a preallocated buffer: ``update`` writes in place, no torch.cat."""

        def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int) -> None:
            super().__init__()
            self.kbuf, self.vbuf = kbuf, vbuf
            self.dtype, self.device = kbuf.dtype, kbuf.device
            self.set_length(length)

        def set_length(self, n: int) -> None:
            self.n = n
            self.keys = self.kbuf[:, :, :n]
            self.values = self.vbuf[:, :, :n]
            self.is_initialized = True

        def lazy_initialization(self, *a, **kw) -> None:  # already initialised
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            m = key_states.shape[-2]
            self.kbuf[:, :, self.n : self.n + m].copy_(key_states)
            self.vbuf[:, :, self.n : self.n + m].copy_(value_states)
            self.set_length(self.n + m)
            return self.keys, self.values

    return InplaceLayer


def make_cache(kind: str, cfg, batch: int, ctx: int, device: str, dtype, slack: int):
    from transformers import DynamicCache

    head_dim = cfg.hidden_size // cfg.num_attention_heads
    shape = (batch, cfg.num_key_value_heads, ctx, head_dim)
    cache = DynamicCache()
    if kind == "dynamic":
        for layer in range(cfg.num_hidden_layers):
            cache.update(
                torch.randn(shape, device=device, dtype=dtype), torch.randn(shape, device=device, dtype=dtype), layer
            )

        def reset():
            for lay in cache.layers:
                lay.keys = lay.keys[:, :, :ctx]
                lay.values = lay.values[:, :, :ctx]
    else:
        layer_cls = _inplace_layer_class()
        big = (batch, cfg.num_key_value_heads, ctx + slack, head_dim)
        cache.layers = [
            layer_cls(torch.randn(big, device=device, dtype=dtype), torch.randn(big, device=device, dtype=dtype), ctx)
            for _ in range(cfg.num_hidden_layers)
        ]

        def reset():
            for lay in cache.layers:
                lay.set_length(ctx)

    return cache, reset


def _decode_one(model, cfg, kind, b, ctx, device, dtype, warmup, repeats, row) -> float:
    graph = kind == "graph"
    cache, reset = make_cache("inplace" if graph else kind, cfg, b, ctx, device, dtype, slack=warmup + repeats + 2)
    ids = torch.randint(5, cfg.vocab_size, (b, 1), device=device)

    def step():
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    if graph:
        # capture one step at context ctx; each replay writes position ctx and attends over ctx + 1
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
                reset()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        reset()
        times = timed(g.replay, device, warmup, repeats)
        del g
    else:
        times = timed(step, device, warmup, repeats, reset=reset)
    med = statistics.median(times)
    row.update(median_s=med, times_s=times, tokens_per_s=b / med)
    return med


def measure_decode(model, cfg, device, dtype, batches, contexts, kinds, warmup, repeats, deadline) -> list[dict]:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * torch.finfo(dtype).bits // 8
    out = []
    broken: set[str] = set()
    for ctx in contexts:
        for b in batches:
            for kind in kinds:
                if kind in broken:
                    continue
                row = {"cache": kind, "batch": b, "context": ctx, "kv_gib": b * ctx * kv_bytes_per_token / 2**30}
                if time.perf_counter() > deadline:
                    row["skipped"] = "time budget"
                    out.append(row)
                    log(f"decode {kind} b={b} ctx={ctx}: skipped (time budget)")
                    continue
                if device.startswith("cuda"):
                    free, _total = torch.cuda.mem_get_info()
                    # the cache, one more layer's worth (torch.cat), activations and slack
                    need = b * ctx * kv_bytes_per_token * (1 + 1.5 / cfg.num_hidden_layers) + (2 << 30)
                    if need > free:
                        row["skipped"] = f"would not fit: needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
                        out.append(row)
                        log(f"decode {kind} b={b} ctx={ctx}: {row['skipped']}")
                        continue
                try:
                    med = _decode_one(model, cfg, kind, b, ctx, device, dtype, warmup, repeats, row)
                    log(f"decode {kind:>7} b={b:>3} ctx={ctx:>5}: {med * 1000:8.2f} ms/step ({b / med:,.0f} tok/s)")
                except Exception as exc:  # noqa: BLE001
                    if not is_oom(exc):
                        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                        log(f"decode {kind} b={b} ctx={ctx}: error {row['error']}")
                        traceback.print_exc()
                        if kind == "graph":
                            broken.add(kind)  # the same capture would fail again
                    else:
                        row["skipped"] = "out of memory"
                        log(f"decode {kind} b={b} ctx={ctx}: out of memory, skipped")
                out.append(row)
                free_memory(device)
    return out


# ----------------------------------------------------------------------------------------- bandwidth


def _uva_gather_kernel():
    """A Triton kernel that reads pages straight out of pinned host memory (zero-copy over UVA)."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather(src, dst, idx, PAGE: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        page = tl.load(idx + pid).to(tl.int64)
        for off in tl.static_range(0, PAGE, BLOCK):
            o = off + tl.arange(0, BLOCK)
            tl.store(dst + pid.to(tl.int64) * PAGE + o, tl.load(src + page * PAGE + o))

    return gather


def _bandwidth_one(device: str, mib: int, page_bytes: int, gather, warmup: int, repeats: int, gen) -> dict:
    cuda = device.startswith("cuda")
    elem = torch.int64
    row = page_bytes // 8
    pages = (mib << 20) // page_bytes
    nbytes = pages * page_bytes
    # the host pool is twice the transfer so the chosen pages are scattered across it
    host_pages = 2 * pages
    src = torch.empty((host_pages, row), dtype=elem, pin_memory=cuda)
    src.random_(0, 1 << 40, generator=gen)
    pageable = torch.empty((pages, row), dtype=elem).random_(0, 1 << 40, generator=gen)
    dst = torch.empty((pages, row), dtype=elem, device=device)
    staging = torch.empty((pages, row), dtype=elem, pin_memory=cuda)
    order = torch.randperm(host_pages, generator=gen)[:pages].contiguous()
    order_dev = order.to(device)
    dst_idx = torch.arange(pages, device=device)
    res: dict = {"mib": mib, "pages": pages, "bytes": nbytes}

    def record(name, fn, check=None):
        try:
            times = timed(fn, device, warmup, repeats)
            if check is not None and not check():
                res[name] = {"error": "copied data did not match"}
                log(f"bandwidth {mib} MiB {name}: copied data did not match")
                return
            med = statistics.median(times)
            res[name] = {"bytes_per_s": nbytes / med, "median_s": med, "times_s": times}
            log(f"bandwidth {mib:>4} MiB {name:<32}: {nbytes / med / 1e9:7.2f} GB/s")
        except Exception as exc:  # noqa: BLE001
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            log(f"bandwidth {mib} MiB {name}: error {res[name]['error']}")

    def scattered_ok():
        k = min(pages, 16)
        return torch.equal(dst[:k].cpu(), src[order[:k]])

    record("contiguous_pinned", lambda: dst.copy_(src[:pages], non_blocking=True))
    record("contiguous_pageable", lambda: dst.copy_(pageable, non_blocking=True))
    srcs = [src[i] for i in order.tolist()]
    dsts = list(dst.unbind(0))
    if hasattr(torch, "_foreach_copy_"):
        record("scattered_foreach_pinned", lambda: torch._foreach_copy_(dsts, srcs, non_blocking=True), scattered_ok)
    dst.zero_()
    if gather is not None:
        record(
            "scattered_uva_kernel_pinned",
            lambda: gather[(pages,)](src, dst, order_dev, PAGE=row, BLOCK=1024),
            scattered_ok,
        )
        dst.zero_()

    def staged():
        torch.index_select(src, 0, order, out=staging)
        dst.copy_(staging, non_blocking=True)

    record("scattered_gather_pinned_staging", staged, scattered_ok)
    dst.zero_()
    record(
        "scattered_profiler_method",
        lambda: dst.index_copy_(0, dst_idx, src[order].to(device, non_blocking=True)),
        scattered_ok,
    )
    return res


def measure_bandwidth(
    device: str, sizes_mib: list[int], page_bytes: int, warmup: int, repeats: int, seed: int = 0
) -> dict:
    """Host->device bytes/s, median of ``repeats`` runs after ``warmup``, for each total size.

    * contiguous_pinned / contiguous_pageable: one copy of the whole buffer;
    * scattered_foreach_pinned: one cudaMemcpyAsync per randomly chosen 64 KiB page from pinned
      memory (``torch._foreach_copy_``; the loop over pages runs in C++), the ``direct`` pattern;
    * scattered_uva_kernel_pinned: one GPU kernel that reads the random pages out of pinned host
      memory over UVA (Triton; SGLang's HiCache ``kernel`` io backend reads host memory this way);
    * scattered_gather_pinned_staging: the CPU gathers the pages into a pinned staging buffer,
      then one copy;
    * scattered_profiler_method: what ``continuum-profile --host-bandwidth``
      (lab/continuum_lab/cli/profiler.py) does: ``src[order]`` (a CPU gather into pageable memory),
      ``.to(device, non_blocking=True)``, then ``index_copy_`` on the device.
    """
    cuda = device.startswith("cuda")
    gen = torch.Generator().manual_seed(seed)
    out: dict = {"page_bytes": page_bytes, "sizes": []}
    try:
        gather = _uva_gather_kernel() if cuda else None
    except Exception as exc:  # noqa: BLE001
        gather = None
        out["uva_kernel_error"] = f"{type(exc).__name__}: {exc}"[:300]
    for mib in sizes_mib:
        out["sizes"].append(_bandwidth_one(device, mib, page_bytes, gather, warmup, repeats, gen))
        free_memory(device)
    return out


# ---------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy model and sizes (smoke test)")
    ap.add_argument("--lengths", default="1000,2000,4000,8000,16000,32000")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--contexts", default="2000,8000")
    ap.add_argument("--caches", default="dynamic,inplace,graph", help="graph: inplace under a CUDA graph (CUDA only)")
    ap.add_argument("--decode-repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bw-sizes-mib", default="64,512")
    ap.add_argument("--page-bytes", type=int, default=64 << 10)
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip what is left after this many seconds")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: prefill,decode,bandwidth")
    args = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    skip = set(args.skip.split(","))
    device, dtype = args.device, torch.bfloat16
    deadline = T0 + args.budget_s
    torch.manual_seed(0)
    import transformers

    result: dict = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "method": {
            "warmup": args.warmup,
            "repeats": args.repeats,
            "statistic": "median",
            "timer": "time.perf_counter around the call, torch.cuda.synchronize before and after",
        },
    }
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        result["gpu"] = {
            "name": p.name,
            "total_mem_gib": p.total_memory / 2**30,
            "multiprocessors": p.multi_processor_count,
            "capability": f"{p.major}.{p.minor}",
        }
        torch.backends.cuda.matmul.allow_tf32 = True
        try:  # does SDPA's flash kernel take this model's grouped-query shapes (else: slower fallbacks)?
            from torch.nn.attention import SDPBackend, sdpa_kernel

            q = torch.randn(1, 32, 256, 128, device=device, dtype=dtype)
            kv = torch.randn(1, 8, 256, 128, device=device, dtype=dtype)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
            result["sdpa_flash_with_gqa"] = True
        except Exception as exc:  # noqa: BLE001
            result["sdpa_flash_with_gqa"] = f"{type(exc).__name__}: {exc}"[:300]
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {result.get('gpu', device)}")

    def dump():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")

    try:
        if "bandwidth" not in skip:
            sizes = [1, 4] if args.tiny else ints(args.bw_sizes_mib)
            result["host_to_device"] = measure_bandwidth(device, sizes, args.page_bytes, warmup=1, repeats=args.repeats)
            dump()
        if not ({"prefill", "decode"} <= skip):
            cfg = llama_config(args.tiny)
            t = time.perf_counter()
            model, info = build_model(cfg, device, dtype)
            sync(device)
            info["build_s"] = time.perf_counter() - t
            info["config"] = {
                k: getattr(cfg, k, None)
                for k in (
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "vocab_size",
                    "rope_theta",
                    "rope_parameters",
                    "max_position_embeddings",
                )
            }
            result["model"] = info
            log(
                f"model: {info['params'] / 1e9:.2f} B params, {info['dtype']}, {info['attn_implementation']}, "
                f"built in {info['build_s']:.1f} s"
            )
            dump()
            if "prefill" not in skip:
                lengths = [64, 128, 256] if args.tiny else ints(args.lengths)
                result["prefill"] = measure_prefill(model, cfg, device, lengths, args.warmup, args.repeats, deadline)
                dump()
            if "decode" not in skip:
                batches = [1, 4] if args.tiny else ints(args.batches)
                contexts = [32, 64] if args.tiny else ints(args.contexts)
                kinds = [k for k in args.caches.split(",") if k and (k != "graph" or device.startswith("cuda"))]
                # graph capture last: a failed capture must not spoil the other measurements
                result["decode"] = []
                for group in ([k for k in kinds if k != "graph"], [k for k in kinds if k == "graph"]):
                    if group:
                        result["decode"] += measure_decode(
                            model,
                            cfg,
                            device,
                            dtype,
                            batches,
                            contexts,
                            group,
                            args.warmup,
                            args.decode_repeats,
                            deadline,
                        )
                        dump()
                dump()
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        traceback.print_exc()
    result["total_s"] = time.perf_counter() - T0
    dump()
    log(f"wrote {args.out}")
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
