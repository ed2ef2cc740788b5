"""``sgl_kernel.kvcacheio``: HiCache's host<->device copies. Imported by SGLang's host pools at
module level on CUDA; called only with ``--enable-hierarchical-cache``, which the GPU run does
not use. Every name is a raising stub."""

from sgl_kernel._placeholder import module_getattr

__getattr__ = module_getattr(globals())
