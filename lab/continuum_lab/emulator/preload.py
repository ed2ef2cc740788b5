"""What the fork server of ``continuum-bench --emulate`` imports once, before any run.

Each emulated run is a fresh process forked from that server, so it starts with SGLang, torch and
the model registry already imported (about three quarters of a run's build time when each run
imported them itself) and still with no scheduler, plugin state or Prometheus samples of an
earlier run: nothing below builds anything.
"""

import atexit
import contextlib
import gc
import io

with contextlib.redirect_stderr(io.StringIO()):  # SGLang's import-time warnings, printed by every run's own log
    # first: the harness sets SGLANG_USE_CPU_ENGINE, which SGLang reads as it is imported
    import continuum_lab.emulator.sglang_engine  # noqa: F401, I001
    import continuum_lab.emulator.driver  # noqa: F401
    import continuum_lab.emulator.run  # noqa: F401
    import sglang.srt.managers.scheduler  # noqa: F401
    import sglang.srt.model_executor.model_runner  # noqa: F401
    import sglang.srt.models.registry  # noqa: F401  (imports every model class: ~3 s)
    import sglang.srt.plugins  # noqa: F401
    import sglang.srt.server_args  # noqa: F401

# the imported modules live as long as the server: keep each run's collector from walking them;
# thawed when the server itself exits, so that its teardown frees them (nanobind reports leaks else)
gc.freeze()
atexit.register(gc.unfreeze)
