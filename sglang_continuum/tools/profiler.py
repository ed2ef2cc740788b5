"""Prefill-time profiler: measure prefill seconds against context length, fit the quadratic the
TTL cost model uses for ``PrefillReload(r)``, and write a profile JSON.

Against a running server (``--url``), or one it starts (``--model``, CPU flags by default):

    continuum-profile --model .models/tiny-llama --lengths 256,512,1024,2048,4096 \\
        --out configs/profiles/cpu-tiny-llama.json

Each point is the median latency of ``/generate`` with one output token over fresh random token
prompts (no prefix-cache hits), so it includes the server's fixed per-request cost (``c0``).

``--host-bandwidth`` also measures host-to-device copy bandwidth for HiCache reloads (stored as
``host_bytes_per_s``): scattered page copies from a (pinned, on CUDA) host buffer into device
memory, the access pattern of a radix-tree load-back. With ``--lengths ''`` only the bandwidth
is measured and merged into an existing profile at ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

from sglang_continuum.core.cost_model import PrefillProfile


def measure(url: str, lengths: list[int], repeats: int, vocab: int, seed: int = 0) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    points = []
    with httpx.Client(timeout=600) as client:
        for n in lengths:
            xs = []
            for _ in range(repeats + 1):
                ids = [rng.randrange(5, vocab) for _ in range(n)]
                t0 = time.perf_counter()
                r = client.post(url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
                r.raise_for_status()
                xs.append(time.perf_counter() - t0)
            points.append((n, statistics.median(xs[1:])))  # the first run warms up this length
            print(f"  {n:>7} tokens: {points[-1][1] * 1000:9.1f} ms", flush=True)
    return points


def measure_host_bandwidth(
    device: str | None = None, total_bytes: int = 1 << 29, page_bytes: int = 1 << 16, repeats: int = 5, seed: int = 0
) -> float:
    """Bytes/s of copying randomly ordered pages from host memory to ``device`` (median run)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    pages = max(1, total_bytes // page_bytes)
    row = page_bytes // 2  # float16 elements per page
    src = torch.empty((pages, row), dtype=torch.float16, pin_memory=device.startswith("cuda")).uniform_()
    dst = torch.empty((pages, row), dtype=torch.float16, device=device)
    gen = torch.Generator().manual_seed(seed)
    times = []
    for _ in range(repeats + 1):
        order = torch.randperm(pages, generator=gen)
        idx = order.to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.index_copy_(0, idx, src[order].to(device, non_blocking=True))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return pages * page_bytes / statistics.median(times[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Measure prefill time vs context length and fit a profile.")
    ap.add_argument("--url", help="a running server; otherwise one is started from --model")
    ap.add_argument("--model", help="model path (starts a CPU server)")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=500, help="token ids are drawn below this")
    ap.add_argument("--name", default=None)
    ap.add_argument("--host-bandwidth", action="store_true", help="also measure host-to-device bandwidth (HiCache)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if not lengths:
        if not args.host_bandwidth or not args.out.is_file():
            ap.error("--lengths '' only updates the host bandwidth of an existing --out profile")
        profile = PrefillProfile.load(args.out)
        profile.host_bytes_per_s = measure_host_bandwidth()
        args.out.write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
        print(f"host-to-device: {profile.host_bytes_per_s / 1e9:.2f} GB/s -> {args.out}")
        return 0
    server = None
    if args.url is None:
        if not args.model:
            ap.error("give --url or --model")
        from sglang_continuum.tools.server import SGLangServer

        total = max(lengths) * 2 + 1024
        server = SGLangServer(args.model, ["--max-total-tokens", str(total), "--context-length", str(total)]).start()
        args.url = server.url
    try:
        print(f"profiling {args.url}")
        points = measure(args.url, lengths, args.repeats, args.vocab)
    finally:
        if server is not None:
            server.stop()
    profile = PrefillProfile.fit(
        points,
        name=args.name or args.out.stem,
        notes=f"measured by sglang_continuum.tools.profiler on {platform.node()} ({platform.processor() or platform.machine()}), "
        f"{args.repeats} repeats per length, median /generate latency with max_new_tokens=1",
    )
    if args.host_bandwidth:
        profile.host_bytes_per_s = measure_host_bandwidth()
        print(f"host-to-device: {profile.host_bytes_per_s / 1e9:.2f} GB/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
    c0, c1, c2 = profile.coeffs
    print(f"fit: {c0:.4g} + {c1:.4g}*n + {c2:.4g}*n^2 s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
