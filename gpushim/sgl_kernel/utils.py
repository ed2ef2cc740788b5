"""``sgl_kernel.utils``: the Triton attention backend asks whether to use programmatic dependent
launch (PDL). No: its decode kernel then never uses Triton's ``gdc_*`` intrinsics."""

from sgl_kernel._placeholder import module_getattr


def is_arch_support_pdl() -> bool:
    return False


__getattr__ = module_getattr(globals())
