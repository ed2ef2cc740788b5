"""Start and stop a real ``sglang.launch_server`` process (benchmarks and end-to-end tests)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import httpx

from sglang_continuum.core.series import CHILD_LABELS

CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--skip-server-warmup")
# A CUDA GPU without sgl_kernel or flashinfer (the lent H100: docs/gpu.md; gpushim/ on PYTHONPATH):
# Triton attention, pytorch sampling, no CUDA graphs (their decode runner calls sgl_kernel), and a
# config-only model (random weights, token ids in and out, no tokenizer).
GPU_SHIM_FLAGS = (
    "--attention-backend", "triton", "--sampling-backend", "pytorch",
    "--disable-prefill-cuda-graph", "--disable-decode-cuda-graph",
    "--load-format", "dummy", "--skip-tokenizer-init",
)  # fmt: skip
GPU_SHIM_ENV = {
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",  # RMSNorm, SiLU-and-mul, RoPE, clamp: their torch code
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",  # the engine asserts sglang-kernel >= 0.4.9
    "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
    "SGLANG_CRASH_ON_JIT_COMPILE": "1",  # no nvcc builds at run time: fail loudly instead
    # on the H100 (torch 2.11) the Rust tree core refused the first insert ("insert value must be an
    # int64 tensor, got Int") though SGLang converts it to int64; cause not established. SGLang's
    # Python tree core is its own fallback
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
}
# An idle scheduler otherwise polls its sockets without pause (~90% of a core); asleep it wakes on
# the first message, and Continuum's idle hooks still run at least once a second (adapter/binding.py).
IDLE_FLAGS = ("--sleep-on-idle",)


PORT_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """The launcher exited because its HTTP port was bound by someone else first."""

    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} was taken before the server could bind it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nobody listens on ``port`` (connections of a server just gone, in TIME_WAIT, do not count:
    uvicorn binds with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class SGLangServer:
    """``with SGLangServer(model, ["--schedule-policy", "continuum"]) as srv: srv.url``"""

    def __init__(
        self,
        model_path: str,
        args: Sequence[str] = (),
        *,
        env: Optional[Mapping[str, str]] = None,
        port: Optional[int] = None,
        log_path: Optional[Path] = None,
        cpu: bool = True,
        startup_timeout_s: float = 240.0,
        cpus: Optional[set[int]] = None,
    ) -> None:
        self.port = port or free_port()
        self.port_chosen_here = port is None  # only a port we chose may be swapped for another
        self.cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *(CPU_FLAGS if cpu else ()),
            *IDLE_FLAGS,
            *args,
        ]
        self.env = {**os.environ, **({"SGLANG_USE_CPU_ENGINE": "1"} if cpu else {}), **(env or {})}
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        # pin the server (every process and thread) to these cores once it is up: it starts on all
        # of them (its three processes import SGLang side by side, ~25 s instead of ~40 s on one core)
        # with the thread pools a start on ``cpus`` would size
        self.cpus = cpus
        if cpus:
            self.env.setdefault("OMP_NUM_THREADS", str(len(cpus)))
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "SGLangServer":
        attempts = PORT_ATTEMPTS if self.port_chosen_here else 1
        while True:
            try:
                return self._start_once()
            except PortTaken:
                attempts -= 1
                if attempts == 0:
                    raise
                # free_port() only found the port free: something else may bind it in the
                # seconds before uvicorn does (SGLang's own side ports among them)
                self.port = free_port()
                self.cmd[self.cmd.index("--port") + 1] = str(self.port)

    def _start_once(self) -> "SGLangServer":
        if not port_is_free(self.port):  # taken already: no need to wait ~20 s for the launcher to find out
            raise PortTaken(self.port)
        # with no log_path the log goes to a temp file, kept only when it explains a failure
        scratch = self.log_path is None
        if scratch:
            fd, name = tempfile.mkstemp(prefix="sglang-server-", suffix=".log")
            os.close(fd)
        log_path = Path(name) if scratch else self.log_path
        with open(log_path, "wb") as log:
            # A new session lets stop() take down the launcher and every scheduler it spawned.
            self.proc = subprocess.Popen(
                self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if b"address already in use" in log_path.read_bytes()[-20_000:]:
                    self.stop()
                    if scratch:
                        log_path.unlink(missing_ok=True)
                    raise PortTaken(self.port)
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {log_path}")
            try:
                # and still ours: a /health answer on a port we lost comes from someone else
                if httpx.get(self.url + "/health", timeout=2).status_code == 200 and self.proc.poll() is None:
                    if self.cpus:
                        pin_tree(self.proc.pid, self.cpus)
                    if scratch:
                        log_path.unlink(missing_ok=True)  # the server keeps writing to the open file
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"server not healthy after {self.startup_timeout_s}s; see {log_path}")

    def stop(self, graceful: bool = True) -> Optional[int]:
        """Take the server down: SIGTERM first (SGLang drains and the plugin saves its statistics;
        SGLang notices within its 5 s watchdog poll), then SIGKILL. ``graceful=False`` kills at
        once: for a server whose results were already read and that keeps no state."""
        if self.proc is None:
            return None
        if graceful and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        return self.proc.returncode

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def parse_metrics(text: str, prefix: str = "sglang:continuum_") -> dict[str, float]:
    """Sum each series of ``prefix`` over its labels (one scheduler per rank); a family's child
    is summed under its label too, as ``series.Series.key`` names it
    (``sglang:continuum_pin_sheds_total{reason="alloc"}``)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            value = float(line.rsplit(" ", 1)[1])
            out[name] = out.get(name, 0.0) + value
            for label, child in _CHILD_LABEL.findall(line.partition("{")[2].rpartition("}")[0]):
                key = f'{name}{{{label}="{child}"}}'
                out[key] = out.get(key, 0.0) + value
    return out


_CHILD_LABEL = re.compile(rf'\b({"|".join(CHILD_LABELS)})="([^"]*)"')


def cpu_split(pin: bool) -> tuple[Optional[set[int]], Optional[set[int]]]:
    """(server cores, client cores): the client gets the last core, the server the rest."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not pin or len(cores) < 2:
        return None, None
    return set(cores[:-1]), {cores[-1]}


@contextmanager
def on_cores(cores: Optional[set[int]]) -> Iterator[None]:
    """Run this process on ``cores`` (the replay client's, ``cpu_split``) for the block; None: as is."""
    before = os.sched_getaffinity(0) if cores else None
    if cores:
        os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        if before:
            os.sched_setaffinity(0, before)


def _tree_threads(pid: int) -> Iterator[int]:
    """The thread ids of ``pid`` and of its descendants (a process that exits meanwhile is skipped)."""
    import psutil

    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        yield from (thread.id for thread in threads)


def pin_tree(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants onto ``cores`` (threads and processes they
    start later inherit it)."""
    for tid in _tree_threads(pid):
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            pass  # exited meanwhile


def tree_cores(pid: int) -> list[int]:
    """Every core some thread of ``pid`` or of its descendants may run on: what the pinning really
    did (SGLang re-binding its threads would show here)."""
    cores: set[int] = set()
    for tid in _tree_threads(pid):
        try:
            cores |= os.sched_getaffinity(tid)
        except OSError:
            pass  # exited meanwhile
    return sorted(cores)
