"""Run NVIDIA's AIPerf (``aiperf profile``, 0.13.0) against a server, and watch the server's
``/metrics`` while it runs.

AIPerf lives in its own venv (``scripts/setup-aiperf.sh`` makes ``.venv-aiperf``: it needs Python
>= 3.11 and pins a dependency tree of its own), so the lab never imports it: ``AIPerfRun`` builds
the command line, runs it as a subprocess and reads back the files it exports
(``profile_export_aiperf.json``: the aggregate figures; ``profile_export.jsonl``: one record per
request). What each flag is for, from AIPerf 0.13.0's source:

* ``--custom-dataset-type mooncake_trace``: multi-turn rows (``workloads/mooncake_trace.py``).
* ``--concurrency N``: N *sessions* in flight. A session takes its slot at its first turn and
  gives it back after its last (``credit/issuer.py``, ``credit/callback_handler.py``), the gaps
  (``delay``) inside it: the closed loop of ``continuum-bench --sessions N``.
* ``--benchmark-duration`` / ``--warmup-duration``: a warm-up phase, drained before a measured
  phase of that length (responses up to AIPerf's grace period, 30 s, after it still count).
* ``--extra-inputs ignore_eos:true``: the server generates exactly ``output_length`` tokens.
* ``--use-server-token-count``: tokens counted from the server's ``usage`` (the client would
  re-tokenise random text otherwise).
* ``--dataset-sampling-strategy shuffle`` with ``--random-seed``: each seed its own order of the
  trace's sessions, as ``continuum-bench`` shuffles its trace per seed.
* Program identity: with ``identity="routing-key"`` the environment sets
  ``AIPERF_HTTP_X_SMG_ROUTING_KEY_FROM_CORRELATION_ID=true``: AIPerf then sends every request of a
  session with ``X-SMG-Routing-Key: <its X-Correlation-ID>``, a fresh UUID per session
  (``transports/base_transports.py`` ``build_headers``), which SGLang 0.5.23 copies onto
  ``Req.routing_key``: one program per session. ``identity="none"`` sends no such header: the
  plugin infers programs from the prefix.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import httpx

from continuum_lab.harness.server import parse_metrics

AIPERF_VENV = Path(".venv-aiperf")  # relative to the repository root, where the lab's tools run
IDENTITIES = ("routing-key", "none")
ROUTING_KEY_ENV = "AIPERF_HTTP_X_SMG_ROUTING_KEY_FROM_CORRELATION_ID"
AGGREGATE_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"


def aiperf_binary(venv: Path = AIPERF_VENV) -> Optional[Path]:
    """The ``aiperf`` of ``venv``, if it is installed there."""
    binary = Path(venv) / "bin" / "aiperf"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


@dataclass
class AIPerfRun:
    """One ``aiperf profile`` of a trace against ``url``."""

    binary: Path
    url: str
    model: str  # the served model name (the request body's ``model``)
    tokenizer: str  # AIPerf synthesises prompts of the trace's lengths with it
    trace: Path
    concurrency: int
    duration_s: float
    warmup_s: float
    seed: int
    artifact_dir: Path
    max_gap_s: Optional[float] = None
    identity: str = "routing-key"
    extra_args: Sequence[str] = ()
    env: dict = field(default_factory=dict)

    def command(self) -> list[str]:
        cmd = [
            str(self.binary), "profile",
            "--model", self.model, "--tokenizer", self.tokenizer, "--url", self.url,
            "--endpoint-type", "chat", "--streaming",
            "--input-file", str(self.trace), "--custom-dataset-type", "mooncake_trace",
            "--concurrency", str(self.concurrency), "--benchmark-duration", f"{self.duration_s:g}",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
            "--random-seed", str(self.seed), "--dataset-sampling-strategy", "shuffle",
            "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
            "--output-artifact-dir", str(self.artifact_dir),
        ]  # fmt: skip
        if self.warmup_s > 0:
            cmd += ["--warmup-duration", f"{self.warmup_s:g}"]
        if self.max_gap_s is not None:
            cmd += ["--inter-turn-delay-cap-seconds", f"{self.max_gap_s:g}"]
        return [*cmd, *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        env.pop(ROUTING_KEY_ENV, None)
        if self.identity == "routing-key":
            env[ROUTING_KEY_ENV] = "true"
        return env

    def shell_command(self) -> str:
        """The command as an operator would type it (the identity's environment in front)."""
        prefix = f"{ROUTING_KEY_ENV}=true " if self.identity == "routing-key" else ""
        return prefix + " ".join(shlex.quote(a) for a in self.command())

    def run(self, log_path: Path, timeout_s: float) -> int:
        """Run to the end (its own log in ``log_path``); the exit status."""
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                self.command(), env=self.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                return proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # its whole session: AIPerf runs ~10 service processes
                proc.wait()
                return -9


def read_aggregate(artifact_dir: Path) -> dict:
    """AIPerf's aggregate export (metric tag -> ``{"unit", "avg", "p50", ...}``)."""
    return json.loads((Path(artifact_dir) / AGGREGATE_FILE).read_text())


def profiling_span_s(artifact_dir: Path) -> Optional[tuple[float, float]]:
    """(first request's start, last response's end) of the measured phase, epoch seconds, from
    AIPerf's per-request records: the span the server's counters are read over."""
    path = Path(artifact_dir) / RECORDS_FILE
    if not path.is_file():
        return None
    lo, hi = None, None
    with path.open() as f:
        for line in f:
            meta = json.loads(line).get("metadata", {})
            if meta.get("benchmark_phase") != "profiling" or meta.get("request_start_ns") is None:
                continue
            start, end = meta["request_start_ns"] / 1e9, (meta.get("request_end_ns") or meta["request_start_ns"]) / 1e9
            lo, hi = min(lo or start, start), max(hi or end, end)
    return (lo, hi) if lo is not None else None


class MetricsWatch:
    """Scrapes ``url/metrics`` every ``every_s`` seconds in a thread while AIPerf runs: AIPerf's
    measured phase starts after its own start-up and warm-up, so the server's counters over that
    phase are the difference of the snapshots around it (``window``)."""

    def __init__(self, url: str, every_s: float = 2.0) -> None:
        self.url, self.every_s = url, every_s
        self.snapshots: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _scrape(self) -> None:
        try:
            text = httpx.get(self.url + "/metrics", timeout=10).text
        except httpx.HTTPError:
            return  # a missed snapshot widens the window by one interval, no more
        self.snapshots.append((time.time(), parse_metrics(text, prefix="sglang:")))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._scrape()
            self._stop.wait(self.every_s)

    def __enter__(self) -> "MetricsWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._scrape()  # one after the end, whatever the interval

    def window(self, span: Optional[tuple[float, float]]) -> Optional[dict]:
        """The counters' change from the last snapshot at or before ``span``'s start to the first
        at or after its end (the whole run without a span), and the snapshots' times."""
        if not self.snapshots:
            return None
        lo_s, hi_s = span or (self.snapshots[0][0], self.snapshots[-1][0])
        before = [s for s in self.snapshots if s[0] <= lo_s] or self.snapshots[:1]
        after = [s for s in self.snapshots if s[0] >= hi_s] or self.snapshots[-1:]
        (t0, m0), (t1, m1) = before[-1], after[0]
        delta = {k: v - m0.get(k, 0.0) for k, v in m1.items()}
        return {"from_s": t0, "to_s": t1, "span": list(span) if span else None, "delta": delta, "end": m1}
