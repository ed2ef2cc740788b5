"""How long one forward takes, predicted from the batch's composition (the emulator's clock).

A profile JSON (``configs/profiles/``) holds two fits on measured points:

* prefill (``coeffs``, the same key the TTL cost model reads, and ``prefix_coeff``): a batch
  that extends request r by ``e_r`` new tokens on top of ``p_r`` cached ones takes
  ``c0 + c1 * sum(e_r) + c2 * sum(e_r**2 + 2 * e_r * p_r) + c3 * sum(p_r**2)`` seconds. The
  ``c2`` term is causal attention (new tokens attend to the prefix and to each other); for one
  request without a prefix the whole is the familiar ``c0 + c1*n + c2*n**2``. ``c3`` is work over
  the cached prefix itself: 0 on a GPU (FlashInfer/FA3 read the prefix once per new token), but
  SGLang's ``torch_native`` CPU backend pays about ``(p + e)**2`` for any extend, so there a
  50-token turn on an 8k-token cached prefix costs two thirds of a fresh 8k prefill (measured).
* decode (``decode.coeffs``): a step over B running requests whose contexts sum to L tokens takes
  ``d0 + d1 * B + d2 * L`` seconds (weights read once per step, KV read per context token).

``kv_bytes_per_token``, ``weights_bytes`` and ``gpu_memory_bytes`` (optional) size the emulated
GPU's KV pool when no ``--max-total-tokens`` is given, as SGLang would with
``--mem-fraction-static``.

``synchronous_forward``: the profiled device runs a forward inside SGLang's ``run_batch`` (on CPU
the streams are no-ops), so with overlap scheduling the next batch is selected only once it
returns; on a GPU (the default, false) ``run_batch`` only queues the kernels and the next
selection runs while they do.

HiCache (``host_bytes_per_s``, with ``kv_bytes_per_token``): loading ``n`` tokens back from host
takes ``n * kv_bytes_per_token / host_bytes_per_s`` seconds, charged to the batch that waits for
them (see ``host_load_seconds``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence


@dataclass(frozen=True)
class StepLatencyModel:
    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]
    name: str = "profile"
    prefix_coeff: float = 0.0
    kv_bytes_per_token: Optional[float] = None
    weights_bytes: Optional[float] = None
    gpu_memory_bytes: Optional[float] = None
    host_bytes_per_s: Optional[float] = None  # host-to-device bandwidth (HiCache load back)
    synchronous_forward: bool = False  # a CPU: run_batch returns when the forward is done
    notes: str = ""

    def __post_init__(self) -> None:
        if len(self.prefill) != 3 or len(self.decode) != 3:
            raise ValueError("prefill and decode need three coefficients each")
        if min(*self.prefill, *self.decode, self.prefix_coeff) < 0:
            raise ValueError("step latency coefficients must be non-negative")

    @classmethod
    def load(cls, path: str | Path) -> "StepLatencyModel":
        path = Path(path)
        data = json.loads(path.read_text())
        if "coeffs" not in data.get("decode", {}):
            raise ValueError(
                f"{path}: no 'decode.coeffs' fit; the emulator needs step latencies for decode too "
                "(measure them with `continuum-profile --decode`)"
            )
        return cls(
            prefill=tuple(float(x) for x in data["coeffs"]),
            decode=tuple(float(x) for x in data["decode"]["coeffs"]),
            name=data.get("name", path.stem),
            prefix_coeff=float(data.get("prefix_coeff", 0.0)),
            kv_bytes_per_token=data.get("kv_bytes_per_token"),
            weights_bytes=data.get("weights_bytes"),
            gpu_memory_bytes=data.get("gpu_memory_bytes"),
            host_bytes_per_s=data.get("host_bytes_per_s"),
            synchronous_forward=bool(data.get("synchronous_forward", False)),
            notes=data.get("notes", ""),
        )

    def prefill_seconds(self, extends: Iterable[tuple[int, int]]) -> float:
        """``extends``: (new tokens, cached prefix tokens) per request in the batch."""
        c0, c1, c2 = self.prefill
        new = quad = prefix_sq = 0
        for e, p in extends:
            new += e
            quad += e * e + 2 * e * p
            prefix_sq += p * p
        return c0 + c1 * new + c2 * quad + self.prefix_coeff * prefix_sq

    def check_host_transfers(self) -> None:
        if not (self.kv_bytes_per_token and self.host_bytes_per_s):
            raise ValueError(
                f"profile {self.name!r} needs kv_bytes_per_token and host_bytes_per_s to emulate HiCache "
                "(host-to-device bandwidth: continuum-profile --host-bandwidth, or lab/continuum_lab/cli/profile_gpu_torch.py)"
            )

    def host_load_seconds(self, tokens: int) -> float:
        """Seconds to load ``tokens`` of KV from host. SGLang overlaps a load with the forward
        layer by layer, so a step that waits for one takes between ``max(compute, load)`` and
        ``compute + load``; the emulator charges the sum, the bound that does not flatter HiCache."""
        if tokens <= 0:
            return 0.0
        self.check_host_transfers()
        return tokens * self.kv_bytes_per_token / self.host_bytes_per_s

    def decode_seconds(self, batch_size: int, context_tokens: int) -> float:
        d0, d1, d2 = self.decode
        return d0 + d1 * batch_size + d2 * context_tokens

    def kv_pool_tokens(self, mem_fraction_static: float = 0.88) -> int:
        """The KV pool SGLang would size on the profiled GPU: the static memory share less the
        weights, divided by the KV bytes of one token."""
        if not (self.kv_bytes_per_token and self.weights_bytes is not None and self.gpu_memory_bytes):
            raise ValueError(f"profile {self.name!r} has no memory facts; pass --max-total-tokens")
        free = self.gpu_memory_bytes * mem_fraction_static - self.weights_bytes
        if free <= 0:
            raise ValueError(f"profile {self.name!r}: the weights do not fit in {mem_fraction_static:.0%} of memory")
        return int(free // self.kv_bytes_per_token)


def fit_prefill(
    fresh: Sequence[tuple[int, float]], extends: Sequence[tuple[int, int, float]] = ()
) -> tuple[tuple[float, float, float], float]:
    """``((c0, c1, c2), c3)`` by non-negative least squares in relative error over fresh prefills
    (tokens, seconds) and extends of a cached prefix (new tokens, prefix tokens, seconds)."""
    import numpy as np
    from scipy.optimize import nnls

    rows = [(n, 0, y) for n, y in fresh] + [tuple(x) for x in extends]
    if len(rows) < 4:
        raise ValueError("need at least 4 prefill points")
    e = np.array([r[0] for r in rows], dtype=np.float64)
    p = np.array([r[1] for r in rows], dtype=np.float64)
    y = np.array([r[2] for r in rows], dtype=np.float64)
    if (y <= 0).any():
        raise ValueError("prefill times must be positive")
    scale = max(1.0, float((e + p).max()))  # condition the system
    e, p = e / scale, p / scale
    a = np.stack([np.ones_like(e), e, e * e + 2 * e * p, p * p], axis=1)
    c, _ = nnls(a / y[:, None], np.ones_like(y))
    return (float(c[0]), float(c[1] / scale), float(c[2] / scale**2)), float(c[3] / scale**2)


def fit_decode(points: Sequence[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Non-negative least squares of ``seconds ~ d0 + d1*B + d2*L`` over (B, L, seconds) points,
    in relative error (small and large batches count alike). A point of 0 s or less is left out: a
    step is the difference of two timed batches, which vanishes on a loaded machine."""
    import numpy as np
    from scipy.optimize import nnls

    points = [p for p in points if p[2] > 0]
    if len(points) < 3:
        raise ValueError("need at least 3 decode points with a positive step time")
    b = np.array([p[0] for p in points], dtype=np.float64)
    ctx = np.array([p[1] for p in points], dtype=np.float64)
    y = np.array([p[2] for p in points], dtype=np.float64)
    sb, sl = max(1.0, b.max()), max(1.0, ctx.max())  # condition the system
    a = np.stack([np.ones_like(b), b / sb, ctx / sl], axis=1)
    c, _ = nnls(a / y[:, None], np.ones_like(y))
    return float(c[0]), float(c[1] / sb), float(c[2] / sl)
