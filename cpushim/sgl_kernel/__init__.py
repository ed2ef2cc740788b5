"""Placeholder for ``sgl_kernel`` on CPU-only machines (see continuum_cpushim.py).

SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) imports ``sgl_kernel``, whose CPU build is not on
PyPI. For the model architectures we run here every layer takes its plain-torch path, so nothing
is called; if something ever is, it fails loudly instead of computing garbage.
"""

__version__ = "0.0.0+continuum-cpu-placeholder"


def _unavailable(name):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: this is the CPU placeholder installed by "
            "sglang-continuum's scripts/setup.sh (no CPU build of sgl_kernel exists on PyPI)."
        )

    stub.__name__ = name
    return stub


def __getattr__(name):
    # ``from sgl_kernel import x`` happens at module import time; hand back a stub that raises
    # only if it is ever called.
    if name.startswith("__"):
        raise AttributeError(name)
    stub = globals()[name] = _unavailable(name)
    return stub
