"""Placeholder for ``sgl_kernel`` on the lent H100 (see docs/gpu.md).

SGLang 0.5.23 pins ``sglang-kernel==0.4.10``, built against torch 2.14.1; the GPU machine has
torch 2.11, against which its library does not load. SGLang imports ``sgl_kernel`` on CUDA but a
Llama model served with the flags in ``continuum_lab.harness.server.GPU_SHIM_FLAGS`` (and the
environment in ``GPU_SHIM_ENV``) calls none of it: norms, SiLU-and-mul and RoPE run their torch
code, attention is Triton, sampling is pytorch, CUDA graphs are off.

Submodules here are exactly those SGLang imports unguarded on that path: ``utils``
(``is_arch_support_pdl``, called by the Triton backend), ``kvcacheio`` and ``quantization``
(imported, not called). ``scalar_type``, ``allreduce``, ``flash_attn`` ... stay absent on purpose:
SGLang imports them inside ``try/except ImportError`` and falls back to its own code.
"""

from sgl_kernel._placeholder import VERSION, module_getattr

__version__ = VERSION
__getattr__ = module_getattr(globals())
