"""Stand-in for one SGLang module on the lent H100 (gpushim/ is on PYTHONPATH there only; docs/gpu.md).

SGLang 0.5.23's Llama MLP asks ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` whether its fused
dual GEMM applies (``layers/dual_gemm.py`` ``DualGemm._select_mode``). That module imports the CuTe
DSL (``cutlass``, from nvidia-cutlass-dsl, over 90 MiB) at module level, which the bundle cannot
carry. Its answer off Blackwell is always no (``can_use_dual_gemm`` requires SM100), so this
stand-in gives that answer and nothing else. Python imports ``sitecustomize`` in every process,
the scheduler's spawned ones included; the one it shadows (the image's, if any) still runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types
from enum import IntEnum

_NAME = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT

    @property
    def is_dynamic(self) -> bool:
        return self in (DualGemmQuantMode.DYNAMIC_PER_TENSOR, DualGemmQuantMode.DYNAMIC_PER_TOKEN)


def can_use_dual_gemm(num_tokens: int, hidden_size: int, intermediate_size: int, quant_mode) -> bool:
    return False


def _not_here(*args, **kwargs):
    raise NotImplementedError(f"{_NAME} (SM100 CuTe DSL kernel) is not available in the GPU shim")


def _install() -> None:
    module = types.ModuleType(_NAME, __doc__)
    module.MAX_DUAL_GEMM_DECODE_TOKENS = 16
    module.DualGemmQuantMode = DualGemmQuantMode
    module.can_use_dual_gemm = can_use_dual_gemm
    module.dual_gemm_swiglu = module.dual_gemm_swiglu_fp8 = _not_here
    sys.modules.setdefault(_NAME, module)


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_install()
_chain()
