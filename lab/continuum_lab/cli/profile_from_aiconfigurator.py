#!/usr/bin/env python3
"""Step-latency profile of SGLang on one H100 SXM, built offline from aiconfigurator's measured per-op data.

NVIDIA's ``aiconfigurator`` (PyPI, Apache-2.0) ships perf databases measured on real GPUs per
system/backend/version (``aiconfigurator/systems/data/h100_sxm/sglang/<version>/*.parquet``: bf16
GEMMs, FlashInfer/FA context and decode attention, custom all-reduce...). Its model classes list
the ops of one forward (``models.get_model``) and its backend sums their interpolated latencies
(``backend.run_static_latency_only`` with ``mode="static_ctx"`` for a prefill forward, ``"static_gen"``
for one decode step). This script asks it for:

* prefill of one request of n new tokens (no prefix), of e new tokens over p cached prefix tokens,
  and of a batch of equal requests;
* one decode step for B requests that each hold L cached tokens (kept to points whose KV fits);

then fits, with non-negative least squares weighted to minimise relative error,
``prefill = c0 + c1*sum(e) + c2*sum(e^2 + 2*e*p)`` and ``decode = d0 + d1*B + d2*sum(L)``,
and writes a profile JSON readable by ``sglang_continuum.core.cost_model.PrefillProfile.load``.
No GPU is needed. Run it in a scratch virtualenv (aiconfigurator pins numpy 1.26, so keep pyarrow < 19):

    python3 -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install aiconfigurator==0.10.0 "pyarrow<19"
    /tmp/aicvenv/bin/python lab/continuum_lab/cli/profile_from_aiconfigurator.py --model llama-3.1-8b \\
        --out configs/profiles/h100-sglang-llama-3.1-8b.json
    /tmp/aicvenv/bin/python lab/continuum_lab/cli/profile_from_aiconfigurator.py --model llama-3.1-70b \\
        --out configs/profiles/h100-sglang-llama-3.1-70b-tp4.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from pathlib import Path

import numpy as np

try:  # only in the scratch virtualenv the docstring describes; main() says so when missing
    import aiconfigurator
    import pandas as pd
    from aiconfigurator.sdk import config, models, perf_database
    from aiconfigurator.sdk.backends.factory import get_backend
    from scipy.optimize import nnls
except ImportError as exc:
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

SYSTEM, BACKEND = "h100_sxm", "sglang"
MODELS = {  # name -> (aiconfigurator model path, tensor parallel size)
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B", 1),
    "llama-3.1-70b": ("meta-llama/Meta-Llama-3.1-70B", 4),
}
PREFILL_N = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
PREFIX_POINTS = [(512, 8192), (512, 32768), (2048, 8192), (2048, 32768)]  # (new e, cached prefix p)
BATCH_POINTS = [(4, 2048), (8, 1024), (4, 512, 8192)]  # (requests, new tokens each[, prefix each])
DECODE_B = [1, 8, 32, 64, 128, 256]
DECODE_L = [1024, 4096, 8192, 16384, 32768]
TORCH_PROFILE = Path("configs/profiles/h100-llama-3.1-8b.json")  # relative to the repository root, where it runs


def prefill_s(backend, model, db, batch: int, new: int, prefix: int = 0) -> float:
    rc = config.RuntimeConfig(batch_size=batch, beam_width=1, isl=prefix + new, osl=1, prefix=prefix)
    return backend.run_static_latency_only(model, db, rc, mode="static_ctx") / 1e3


def decode_s(backend, model, db, batch: int, ctx: int) -> float:
    # osl=2 -> exactly one decode step; its attention reads ctx + 1 keys per request
    rc = config.RuntimeConfig(batch_size=batch, beam_width=1, isl=ctx, osl=2)
    return backend.run_static_latency_only(model, db, rc, mode="static_gen") / 1e3


def fit_relative(features: np.ndarray, y: np.ndarray) -> tuple[list[float], float]:
    """NNLS of y ~ features @ c with every row divided by y (minimises relative error); returns c, max |rel err|."""
    scale = features.max(axis=0)
    a = features / scale / y[:, None]
    c, _ = nnls(a, np.ones_like(y))
    c = c / scale
    return [float(v) for v in c], float(np.max(np.abs(features @ c / y - 1)))


def coverage(db, heads: int, kv_heads: int) -> str:
    """Measured ranges of this model's attention shape in the DB (beyond them aiconfigurator extrapolates)."""
    root = Path(db.systems_root) / db.system_spec["data_dir"] / db.backend / db.version
    out = []
    for op in ("context_attention", "generation_attention"):
        if not (root / f"{op}_perf.parquet").exists():
            out.append(f"{op}: no table of its own in {db.version} (rows inherited from sibling versions)")
            continue
        d = pd.read_parquet(root / f"{op}_perf.parquet")
        d = d[
            (d.num_heads == heads)
            & (d.num_key_value_heads == kv_heads)
            & (d.head_dim == 128)
            & (d.attn_dtype == "bfloat16")
            & (d.kv_cache_dtype == "bfloat16")
        ]
        ctx = d.isl + (d.step if op == "generation_attention" else 0)
        out.append(
            f"{op} rows for {heads} q / {kv_heads} kv heads: {len(d)}, tokens {ctx.min()}..{ctx.max()}, "
            f"batch {d.batch_size.min()}..{d.batch_size.max()}, max batch at the longest context "
            f"{d[ctx == ctx.max()].batch_size.max()}"
        )
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b")
    ap.add_argument("--version", help="sglang DB version (default: newest with its own measured tables)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if _MISSING is not None:
        raise SystemExit(f"needs aiconfigurator 0.10.0 (a scratch virtualenv, see this module's docstring): {_MISSING}")
    logging.basicConfig(level=logging.ERROR)  # aiconfigurator warns at length about grid extrapolation

    model_path, tp = MODELS[args.model]
    version = args.version or perf_database.get_latest_database_version(SYSTEM, BACKEND)
    db = perf_database.get_database(SYSTEM, BACKEND, version)
    backend = get_backend(BACKEND)
    model = models.get_model(model_path, config.ModelConfig(tp_size=tp), BACKEND)
    heads, kv_heads, layers = model._num_heads // tp, model._num_kv_heads_per_gpu, model._num_layers

    kv_bytes = int(model.get_kvcache_bytes_per_sequence(1))  # per token, all layers, this GPU
    weights = int(sum(op.get_weights() for op in model.context_ops))
    gpu_mem = int(db.system_spec["gpu"]["mem_capacity"])
    kv_budget = 0.9 * gpu_mem - weights  # decode points must fit their KV beside the weights

    # --- prefill ---
    single = [[n, prefill_s(backend, model, db, 1, n)] for n in PREFILL_N]
    rows = [(1, n, 0, s) for n, s in single]
    rows += [(1, e, p, prefill_s(backend, model, db, 1, e, p)) for e, p in PREFIX_POINTS]
    rows += [(b, e, (rest or [0])[0], prefill_s(backend, model, db, b, e, *rest)) for b, e, *rest in BATCH_POINTS]
    feats = np.array([[1.0, b * e, b * (e * e + 2.0 * e * p)] for b, e, p, _ in rows])
    y = np.array([r[3] for r in rows])
    coeffs, pre_err = fit_relative(feats, y)
    fitted = feats @ np.array(coeffs)
    extra = "; ".join(
        f"{b}x(e={e}, p={p}): {s * 1e3:.1f} ms (fit {f * 1e3:.1f}"
        + (f", {b} x single {prefill_s(backend, model, db, 1, e, p) * 1e3:.1f}" if b > 1 else "")
        + (f", same e without prefix {prefill_s(backend, model, db, b, e) * 1e3:.1f}" if p else "")
        + ")"
        for (b, e, p, s), f in zip(rows[len(single) :], fitted[len(single) :])
    )

    # --- decode ---
    dec = [
        [b, b * L, decode_s(backend, model, db, b, L)]
        for b in DECODE_B
        for L in DECODE_L
        if b * L * kv_bytes <= kv_budget
    ]
    dfeats = np.array([[1.0, b, sl] for b, sl, _ in dec])
    dcoeffs, dec_err = fit_relative(dfeats, np.array([d[2] for d in dec]))

    # --- provenance ---
    rc = config.RuntimeConfig(batch_size=1, beam_width=1, isl=8192, osl=2)
    src = {
        **backend.run_static(model, db, rc, mode="static_ctx").get_context_source_dict(),
        **backend.run_static(model, db, rc, mode="static_gen").get_generation_source_dict(),
    }
    tables = sorted(k for k, v in src.items() if v in ("silicon", "mixed"))
    formula = sorted(k for k, v in src.items() if v not in ("silicon", "mixed"))
    compare = ""
    if args.model == "llama-3.1-8b" and TORCH_PROFILE.exists():
        lines = []
        for n, t in json.loads(TORCH_PROFILE.read_text())["points"]:
            a = prefill_s(backend, model, db, 1, int(n))
            lines.append(
                f"n={int(n)}: aiconfigurator {a * 1e3:.1f} ms vs torch-measured {t * 1e3:.1f} ms (ratio {a / t:.2f})"
            )
        compare = (
            f" Comparison with {TORCH_PROFILE.name} (real H100, PyTorch sdpa, eager, random weights): "
            + "; ".join(lines)
            + "."
        )
    spread = []  # the same single-request prefill / decode points under the DB's other sglang versions
    for v in sorted(perf_database.get_supported_databases()[SYSTEM][BACKEND]):
        if v != version:
            vdb = perf_database.get_database(SYSTEM, BACKEND, v)
            rp = [prefill_s(backend, model, vdb, 1, n) / s for n, s in single]
            rd = [decode_s(backend, model, vdb, b, sl // b) / s for b, sl, s in dec]
            spread.append(f"{v}: prefill x{min(rp):.2f}..{max(rp):.2f}, decode x{min(rd):.2f}..{max(rd):.2f}")
    name = f"h100-sglang-{args.model}" + (f"-tp{tp}" if tp > 1 else "")
    notes = (
        f"DERIVED, not run: aiconfigurator {aiconfigurator.__version__} (pip install aiconfigurator=={aiconfigurator.__version__}) "
        f"perf database {SYSTEM}/{BACKEND}/{version} (per-op latencies measured by NVIDIA on 'NVIDIA H100 80GB HBM3' "
        f"with SGLang {version}), model {model_path} bf16 weights/KV, TP{tp} ({layers} layers, {heads} q / {kv_heads} kv heads "
        f"per GPU), summed by aiconfigurator's SGLANGBackend.run_static_latency_only (static_ctx = one prefill forward, "
        f"static_gen with osl=2 = one decode step), DatabaseMode {db._default_database_mode.name}. "
        f"Ops interpolated from measured tables: {', '.join(tables)} (attention 'mixed' = measured kernel + formula "
        f"rope/KV-write); ops from aiconfigurator's roofline-with-utilisation formulas ('empirical'): {', '.join(formula)}. "
        f"Coverage: {coverage(db, heads, kv_heads)}; GEMM tables measured for m <= 32768 on an (n, k) grid "
        f"(these exact n, k mostly interpolated); all-reduce (TP > 1) from SGLang's custom all-reduce table, "
        f"CUDA-graph mode. Outside these ranges aiconfigurator extrapolates its grids. Prefix: aiconfigurator models e new tokens over p cached "
        f"tokens as GEMMs on e tokens plus the measured full-causal attention of p+e tokens scaled by "
        f"((p+e)^2 - p^2)/(p+e)^2, i.e. proportional to e^2 + 2ep, which is the c2 term. "
        f"Fit: NNLS with rows divided by the value (relative error), prefill on the {len(single)} single-request points "
        f"plus the prefix/batch points ({extra}); max relative error {pre_err:.1%}. "
        f"Decode points: B in {DECODE_B} x L in {DECODE_L} where B*L*kv_bytes_per_token <= 0.9*gpu_memory - weights "
        f"({len(dec)} points, [B, sum_L, seconds]); max relative error {dec_err:.1%}. "
        f"Other DB versions relative to {version} on the same points: {'; '.join(spread)}. "
        f"Caveats: kernel times only: no scheduler, CPU launch, sampling, HTTP or CUDA-graph capture overhead "
        f"(aiconfigurator's SGLang backend adds no dispatch overhead), so c0/d0 are GPU-only floors; decode is "
        f"roughly flat in B while weight-bound, so the linear d1 term is an average. gpu_memory_bytes is "
        f"aiconfigurator's h100_sxm mem_capacity (80 GiB; nvidia-smi shows 81559 MiB). weights_bytes and "
        f"kv_bytes_per_token are from aiconfigurator's model (per GPU).{compare} "
        f"Generated {datetime.date.today().isoformat()} by `{Path(sys.executable).name} scripts/{Path(__file__).name} "
        f"{' '.join(sys.argv[1:])}`."
    )
    profile = {
        "name": name,
        "coeffs": coeffs,
        "points": single,
        "decode": {"coeffs": dcoeffs, "points": dec},
        "kv_bytes_per_token": kv_bytes,
        "weights_bytes": weights,
        "gpu_memory_bytes": gpu_mem,
        "notes": notes,
        # what SGLang 0.5.23 resolves by itself on an 80 GB GPU (arg_groups/memory_hook.py: chunked prefill 8192
        # for 60-90 GB) and Llama-3.1's context; the emulator's scheduler runs on device cpu, whose defaults differ
        "server_args": ["--chunked-prefill-size", "8192", "--context-length", "131072"],
    }
    Path(args.out).write_text(json.dumps(profile, indent=2) + "\n")
    print(
        f"{name}: prefill {coeffs} (max rel err {pre_err:.1%}), decode {dcoeffs} (max rel err {dec_err:.1%}) -> {args.out}"
    )


if __name__ == "__main__":
    main()
