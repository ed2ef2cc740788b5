"""CPU-only shim for running unmodified SGLang 0.5.23 on a machine without a GPU.

Installed into the virtual environment by scripts/setup.sh (CPU set-up only; never on GPU hosts).
It stands in for exactly three things that do not exist on a CPU-only machine:

1. torchvision's compiled ops. PyPI's torchvision 0.28.0 is a CUDA build whose ``_C`` library does
   not load against CPU torch, after which its import fails at
   ``register_fake("torchvision::nms")``. SGLang imports torchvision at start-up (multimodal
   configs) but never runs these ops for a text model. We declare the two op schemas before
   torchvision registers its fake kernels; calling them would still fail loudly.
2. ``sgl_kernel`` (see the ``sgl_kernel`` placeholder package beside this file).
3. Two CUDA-only pieces of HiCache's host<->device path:
   - ``cudaHostRegister`` (``sglang.srt.mem_cache.pool_host.common._cuda_host_register``).
     Page-locking host memory only speeds up DMA to a GPU; without CUDA the host pool stays
     ordinary CPU memory.
   - ``sgl_kernel.kvcacheio.transfer_kv_direct``, the ``--hicache-io-backend direct`` copy for the
     ``layer_first`` host layout, which ``pool_host/mha.py`` imports only on CUDA/ROCm/XPU. Its
     stand-in is the same row copy in plain torch (``dst[i][dst_idx] = src[i][src_idx]`` per
     layer, pages being runs of consecutive rows).
   Everything else of HiCache (host pool, ``HybridCacheController``, write-through/back, load back,
   host locks, ``torch.cpu`` streams and events) runs unmodified. CPU servers therefore use
   ``--hicache-io-backend direct --hicache-mem-layout layer_first``.

The ``.pth`` file only installs an import hook; torch is not imported until one of these modules is.
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


def _skip_host_register(module) -> None:
    import torch

    if not torch.cuda.is_available():
        module._cuda_host_register = lambda buffer, registration_granularity_bytes=None: None


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """CPU stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct`` (same arguments)."""
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)].to(dst.dtype)


def _bind_direct_transfer(module) -> None:
    if not hasattr(module, "transfer_kv_direct"):
        module.transfer_kv_direct = transfer_kv_direct


# module -> fix applied right after the module's own code ran
_AFTER_IMPORT = {
    "sglang.srt.mem_cache.pool_host.common": _skip_host_register,
    "sglang.srt.mem_cache.pool_host.mha": _bind_direct_transfer,
}


class _ShimFinder(importlib.abc.MetaPathFinder):
    """Runs a fix before torchvision is imported and after each module of ``_AFTER_IMPORT`` is."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision":
            _declare_torchvision_ops()
        elif fullname in _AFTER_IMPORT:
            return self._patched_after_exec(fullname, path, target, _AFTER_IMPORT[fullname])
        return None

    def _patched_after_exec(self, fullname, path, target, fix):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_and_patch(module, _exec=exec_module):
                    _exec(module)
                    fix(module)

                spec.loader.exec_module = exec_and_patch
                return spec
        return None


def install() -> None:
    if not any(isinstance(f, _ShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShimFinder())
