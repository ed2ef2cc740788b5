"""Prefill-time profiler: measure prefill seconds against context length, fit the quadratic the
TTL cost model uses for ``PrefillReload(r)``, and write a profile JSON.

Against a running server (``--url``), or one it starts (``--model``, CPU flags by default):

    continuum-profile --model .models/tiny-llama --lengths 256,512,1024,2048,4096 \\
        --out configs/profiles/cpu-tiny-llama.json

Each point is the median latency of ``/generate`` with one output token over fresh random token
prompts (no prefix-cache hits), so it includes the server's fixed per-request cost (``c0``).

``--decode`` also measures what the emulator needs beyond fresh prefills: turns that extend a
cached prefix (``prefix_coeff``, fitted jointly with ``coeffs``) and decode step latency against
batch size and context (``decode``). For the decode steps, B concurrent streamed requests of L
fresh tokens each are run twice, with a short and a long forced output; the difference in wall
time over the difference in output length is the time of one decode step over that batch. The
server runs on the cores ``continuum-bench`` gives it (all but the last), so a profile describes
the bench's server.

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
import numpy as np

from continuum_lab.bench.calibrate import measure_prefill as measure
from sglang_continuum.core.cost_model import PrefillProfile


def fit_profile(points, **kw) -> PrefillProfile:
    """Quadratic through (tokens, seconds) with non-negative coefficients, least squares in
    *relative* error (the points span decades: absolute error would fit the longest only)."""
    from scipy.optimize import nnls

    x = np.array([p[0] for p in points], dtype=np.float64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    if x.size < 3:
        raise ValueError("need at least 3 points to fit a quadratic")
    if (y <= 0).any():
        raise ValueError("prefill times must be positive")
    scale = max(1.0, float(x.max()))  # condition the system
    a = np.stack([np.ones_like(x), x / scale, (x / scale) ** 2], axis=1)
    c, _ = nnls(a / y[:, None], np.ones_like(y))
    coeffs = (float(c[0]), float(c[1] / scale), float(c[2] / scale**2))
    return PrefillProfile(coeffs, points=[list(p) for p in points], **kw)


def _batch_seconds(client: httpx.Client, url: str, prompts: list[list[int]], new_tokens: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    def one(ids: list[int]) -> None:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0.0},
            "stream": True,  # as the bench's replay client: every step's tokens cross the server's processes
        }
        with client.stream("POST", url + "/generate", json=body) as r:
            r.raise_for_status()
            for _ in r.iter_lines():
                pass

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(one, prompts))
    return time.perf_counter() - t0


def measure_extend(
    url: str, prefixes: list[int], new: list[int], vocab: int, repeats: int = 3, seed: int = 2
) -> list[tuple[int, int, float]]:
    """(new tokens, cached prefix tokens, seconds): a fresh prefix is sent once (cached), then the
    same prefix plus ``e`` fresh tokens is timed."""
    rng = random.Random(seed)
    fresh = lambda n: [rng.randrange(5, vocab) for _ in range(n)]  # noqa: E731
    points = []
    with httpx.Client(timeout=600) as client:
        for p in prefixes:
            for e in new:
                xs = []
                for _ in range(repeats + 1):
                    base = fresh(p)
                    client.post(url + "/generate", json={"input_ids": base, "sampling_params": {"max_new_tokens": 1}})
                    t0 = time.perf_counter()
                    r = client.post(
                        url + "/generate", json={"input_ids": base + fresh(e), "sampling_params": {"max_new_tokens": 1}}
                    )
                    r.raise_for_status()
                    xs.append(time.perf_counter() - t0)
                    if r.json()["meta_info"].get("cached_tokens", p) < p:
                        raise RuntimeError(f"the {p}-token prefix was not cached; is the pool too small?")
                points.append((e, p, statistics.median(xs[1:])))
                print(f"  extend {e:>5} on {p:>6} cached: {points[-1][2] * 1000:9.1f} ms", flush=True)
    return points


def measure_decode(
    url: str,
    batches: list[int],
    contexts: list[int],
    vocab: int,
    *,
    short: int = 4,
    long: int = 36,
    repeats: int = 3,
    seed: int = 1,
) -> list[tuple[int, int, float]]:
    """(batch size, summed context tokens, seconds per decode step) points."""
    rng = random.Random(seed)
    fresh = lambda n: [rng.randrange(5, vocab) for _ in range(n)]  # noqa: E731
    points = []
    limits = httpx.Limits(max_connections=max(batches) + 4)
    with httpx.Client(timeout=600, limits=limits) as client:
        for ctx in contexts:
            for b in batches:
                steps = []
                for _ in range(repeats + 1):
                    t_short = _batch_seconds(client, url, [fresh(ctx) for _ in range(b)], short)
                    t_long = _batch_seconds(client, url, [fresh(ctx) for _ in range(b)], long)
                    steps.append((t_long - t_short) / (long - short))
                step = max(0.0, statistics.median(steps[1:]))  # the first round warms up this shape
                points.append((b, b * (ctx + (short + long) // 2), step))
                print(f"  decode B={b:>3} L={ctx:>6}: {step * 1000:8.2f} ms/step", flush=True)
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
    ap.add_argument("--decode", action="store_true", help="also measure prefix extends and decode steps (emulator)")
    ap.add_argument("--extend-prefixes", default="1000,2000,4000,8000")
    ap.add_argument("--extend-new", default="50,500")
    ap.add_argument("--decode-batches", default="1,2,4,8,16")
    ap.add_argument("--decode-contexts", default="256,1024,2048")
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
        from continuum_lab.bench.policies import context_length
        from continuum_lab.harness.server import SGLangServer, cpu_split

        batches = [int(x) for x in args.decode_batches.split(",")] if args.decode else [1]
        contexts = [int(x) for x in args.decode_contexts.split(",")] if args.decode else [0]
        total = max(max(lengths) * 2, max(batches) * (max(contexts) + 64)) + 1024
        server = SGLangServer(
            args.model,
            ["--max-total-tokens", str(total), "--context-length", str(context_length(args.model, total))],
            cpus=cpu_split(True)[0],
        ).start()
        args.url = server.url
    try:
        print(f"profiling {args.url}")
        points = measure(args.url, lengths, args.repeats, args.vocab)
        decode_points, extend_points = [], []
        if args.decode:
            extend_points = measure_extend(
                args.url,
                [int(x) for x in args.extend_prefixes.split(",")],
                [int(x) for x in args.extend_new.split(",")],
                args.vocab,
            )
            decode_points = measure_decode(
                args.url,
                [int(x) for x in args.decode_batches.split(",")],
                [int(x) for x in args.decode_contexts.split(",")],
                args.vocab,
            )
    finally:
        if server is not None:
            server.stop()
    profile = fit_profile(
        points,
        name=args.name or args.out.stem,
        notes=f"measured by continuum_lab.cli.profiler on {platform.node()} ({platform.processor() or platform.machine()}), "
        f"{args.repeats} repeats per length, median /generate latency with max_new_tokens=1",
    )
    if args.host_bandwidth:
        profile.host_bytes_per_s = measure_host_bandwidth()
        print(f"host-to-device: {profile.host_bytes_per_s / 1e9:.2f} GB/s")
    data = profile.to_dict()
    if decode_points:
        from continuum_lab.emulator.step_model import fit_decode, fit_prefill

        coeffs, prefix_coeff = fit_prefill(points, extend_points)
        data["coeffs"], data["prefix_coeff"] = list(coeffs), prefix_coeff
        data["extend_points"] = [list(p) for p in extend_points]
        d = fit_decode(decode_points)
        data["decode"] = {"coeffs": list(d), "points": [list(p) for p in decode_points]}
        data["notes"] += (
            "; decode: seconds per step over B concurrent streamed requests = (wall time with 36 forced output tokens - "
            "with 4) / 32, median of 3 rounds after a warm-up; fit d0 + d1*B + d2*sum(context)"
        )
        print(
            f"prefill fit with prefixes: {coeffs} + {prefix_coeff:.4g}*p^2; decode fit: {d[0]:.4g} + {d[1]:.4g}*B + {d[2]:.4g}*L s"
        )
    if server is not None:  # the CPU server this command started: its forward blocks the scheduler
        data["synchronous_forward"] = True
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    c0, c1, c2 = profile.coeffs
    print(f"fit: {c0:.4g} + {c1:.4g}*n + {c2:.4g}*n^2 s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
