"""CPU-only shim for running unmodified SGLang 0.5.23 on a machine without a GPU.

Installed into the virtual environment by scripts/setup.sh (CPU set-up only; never on GPU hosts).
It stands in for exactly two things that do not exist on CPU-only PyPI:

1. torchvision's compiled ops. PyPI's torchvision 0.28.0 is a CUDA build whose ``_C`` library does
   not load against CPU torch, after which its import fails at
   ``register_fake("torchvision::nms")``. SGLang imports torchvision at start-up (multimodal
   configs) but never runs these ops for a text model. We declare the two op schemas before
   torchvision registers its fake kernels; calling them would still fail loudly.
2. ``sgl_kernel`` (see the ``sgl_kernel`` placeholder package beside this file).

The ``.pth`` file only installs an import hook; torch is not imported until torchvision is.
"""

from __future__ import annotations

import importlib.abc
import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIB = None


def _declare_torchvision_ops() -> None:
    global _LIB
    if _LIB is not None:
        return
    import torch

    missing = [name for name in _SCHEMAS if not _has_op(torch, name)]
    if missing:
        _LIB = torch.library.Library("torchvision", "FRAGMENT")
        for name in missing:
            _LIB.define(_SCHEMAS[name])


def _has_op(torch, name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
        return True
    except RuntimeError:
        return False


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _declare_torchvision_ops()
        return None


def install() -> None:
    if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionFinder())
