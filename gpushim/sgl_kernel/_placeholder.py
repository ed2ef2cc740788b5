"""Stubs for names of ``sgl_kernel`` that the GPU run imports but never calls.

SGLang imports these names at module level (``from sgl_kernel import rmsnorm`` under
``if _is_cuda``); with ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` and the flags of
``continuum_lab.harness.server.GPU_SHIM_FLAGS`` none of them is called. If one ever is, it
raises instead of computing garbage, and the error names the kernel to replace.
"""

from __future__ import annotations

VERSION = "0.0.0+continuum-gpu-placeholder"


def unavailable(qualname: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"{qualname} is not available: this is sglang-continuum's GPU placeholder for sgl_kernel "
            "(gpushim/, docs/gpu.md), used where the real sglang-kernel wheel cannot load. Give it a torch "
            "stand-in in gpushim/sgl_kernel or choose a server flag that avoids it."
        )

    stub.__name__ = qualname.rsplit(".", 1)[-1]
    stub.__qualname__ = qualname
    return stub


def module_getattr(module_globals: dict):
    """A module ``__getattr__`` that hands out (and caches) a raising stub for any public name."""
    module_name = module_globals["__name__"]

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = module_globals[name] = unavailable(f"{module_name}.{name}")
        return stub

    return __getattr__
