"""``sgl_kernel.quantization``: GGUF kernels, imported by ``layers/quantization/gguf.py`` on CUDA
and never called for an unquantized model. Every name is a raising stub."""

from sgl_kernel._placeholder import module_getattr

__getattr__ = module_getattr(globals())
