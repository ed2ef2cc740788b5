"""Several SGLang workers behind SGLang's router (``smg``, the Shepherd Model Gateway): how a
program-affine fleet is run, benchmarked and tested.

``Fleet`` starts N real ``sglang.launch_server`` workers with identical flags (their startups
overlap) and ``smg launch --worker-urls ... --policy P`` in front; clients talk to the router and
send the program id as ``X-SMG-Routing-Key``, which ``consistent_hashing`` hashes to one worker.
With ``share_stats`` every worker publishes its tool samples on its own zmq endpoint and
subscribes to all of them (``core/stats_exchange.py``).

``worker_table`` reads the per-worker story from each worker's own ``/metrics``: programs, pin
hits, requests, cache hit, queue time, and whether each program's turns all reached it
(``programs_affine`` / ``programs_split``, counted by the worker at the program's last step).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Optional, Sequence

import httpx

from continuum_lab.harness.server import SGLangServer, free_port, parse_metrics
from sglang_continuum.core.series import family_name, series_name

ROUTER_POLICIES = ("consistent_hashing", "round_robin", "cache_aware", "prefix_hash", "power_of_two", "random")
# smg 1.13 leaves a worker out of routing while its KV usage is >= 0.8 or 8 requests wait, on every
# policy. Pins keep a Continuum worker's KV full by design, so with the defaults consistent hashing
# sends most later turns elsewhere (measured: 8% program affinity, docs/results/multi-worker/).
ROUTER_ARGS = ("--disable-worker-overload-protection",)
STATS_PUBLISH_ENV = "SGLANG_CONTINUUM_STATS_PUBLISH_ENDPOINT"
STATS_PEERS_ENV = "SGLANG_CONTINUUM_STATS_PEER_ENDPOINTS"


def smg_binary() -> str:
    """The ``smg`` console script of this environment (``pip install smg``; requirements/router.txt)."""
    local = Path(sys.executable).with_name("smg")
    found = str(local) if local.exists() else shutil.which("smg")
    if not found:
        raise RuntimeError("smg (SGLang's router) is not installed: pip install -r requirements/router.txt")
    return found


class SmgRouter:
    """``smg launch`` in front of ``worker_urls``; ``url`` is where clients send requests."""

    def __init__(
        self,
        worker_urls: Sequence[str],
        policy: str = "consistent_hashing",
        *,
        extra_args: Sequence[str] = (),
        log_path: Optional[Path] = None,
        startup_timeout_s: float = 180.0,
        cpus: Optional[set[int]] = None,
    ) -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"router policy {policy!r}: choose from {ROUTER_POLICIES}")
        self.port = free_port()
        self.policy = policy
        self.workers = len(worker_urls)
        self.cmd = [
            smg_binary(),
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--worker-urls",
            *worker_urls,
            "--policy",
            policy,
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warn",
            "--request-timeout-secs",
            "1800",
            # the workers are up before smg starts: register them at once, not at smg's 30 s
            # re-check, and give a busy CPU worker longer than 5 s to answer a health probe
            "--worker-startup-check-interval",
            "1",
            "--health-check-timeout-secs",
            "30",
            *extra_args,
        ]
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.cpus = cpus
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "SmgRouter":
        import os

        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        pin = (lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with {self.proc.returncode}; see {self.log_path}")
            try:  # /health answers at once; /readiness once smg has registered every worker
                ready = httpx.get(self.url + "/readiness", timeout=2)
                last = f"{ready.status_code} {ready.text[:200]}"
                if ready.status_code == 200 and ready.json().get("healthy_workers") == self.workers:
                    return self
            except (httpx.HTTPError, ValueError) as exc:
                last = repr(exc)[:200]
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"smg not ready after {self.startup_timeout_s}s (last /readiness: {last}); see {self.log_path}"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "SmgRouter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Fleet:
    """N workers with identical flags, plus the router: ``with Fleet(model, args, n=2) as f: f.url``."""

    def __init__(
        self,
        model_path: str,
        args: Sequence[str] = (),
        *,
        workers: int = 2,
        router_policy: str = "consistent_hashing",
        router_args: Sequence[str] = ROUTER_ARGS,
        env: Optional[Mapping[str, str]] = None,
        share_stats: bool = True,
        log_dir: Optional[Path] = None,
        cpu: bool = True,
        cpus: Optional[set[int]] = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        # Unix sockets, not TCP ports: a port free_port() found free can be taken by a worker's own
        # side ports in the seconds before the scheduler binds it (seen: "Address already in use")
        self._stats_dir = tempfile.mkdtemp(prefix="continuum-stats-") if share_stats else None
        self.stats_endpoints = [f"ipc://{self._stats_dir}/worker{i}" for i in range(workers)] if share_stats else []
        self.workers = []
        for i in range(workers):
            worker_env = dict(env or {})
            if share_stats:
                worker_env[STATS_PUBLISH_ENV] = self.stats_endpoints[i]
                worker_env[STATS_PEERS_ENV] = ",".join(self.stats_endpoints)
            log = log_dir / f"worker{i}.log" if log_dir else None
            self.workers.append(SGLangServer(model_path, args, env=worker_env, log_path=log, cpu=cpu, cpus=cpus))
        self.router_policy = router_policy
        self.router_args = list(router_args)
        self.log_dir = log_dir
        self.cpus = cpus
        self.router: Optional[SmgRouter] = None

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def start(self) -> "Fleet":
        try:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                for future in [pool.submit(w.start) for w in self.workers]:
                    future.result()
            log = self.log_dir / "router.log" if self.log_dir else None
            self.router = SmgRouter(
                self.worker_urls, self.router_policy, extra_args=self.router_args, log_path=log, cpus=self.cpus
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for w in self.workers:
            w.stop()
        if self._stats_dir is not None:
            shutil.rmtree(self._stats_dir, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# per-worker report column -> scraped series (sums over a worker's scheduler processes)
WORKER_SERIES = {
    "programs": series_name("programs.seen"),
    "programs_affine": series_name("programs.affine"),
    "programs_split": series_name("programs.split"),
    "pin_hits": series_name("counters.hits"),
    "pin_sheds": family_name("pin_sheds"),  # every reason
    "requests": "sglang:num_requests_total",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "cached_tokens": "sglang:cached_tokens_total",
    "queue_time_s_sum": "sglang:queue_time_seconds_sum",
    "queue_time_s_count": "sglang:queue_time_seconds_count",
    "stats_samples_sent": series_name("exchange.sent"),
    "stats_samples_received": series_name("exchange.received"),
}


def worker_table(per_worker: Sequence[tuple[str, str, str]]) -> list[dict]:
    """One row per worker from (url, /metrics before, /metrics after): what this run did there."""
    rows = []
    for url, before_text, after_text in per_worker:
        before, after = parse_metrics(before_text, "sglang:"), parse_metrics(after_text, "sglang:")
        row: dict = {"url": url}
        row |= {k: after.get(v, 0.0) - before.get(v, 0.0) for k, v in WORKER_SERIES.items()}
        row["cache_hit_ratio"] = row["cached_tokens"] / row["prompt_tokens"] if row["prompt_tokens"] else 0.0
        count = row.pop("queue_time_s_count")
        row["mean_queue_s"] = row.pop("queue_time_s_sum") / count if count else 0.0
        rows.append(row)
    return rows


def fleet_summary(rows: Sequence[dict]) -> dict:
    """``program_affinity``: of the programs whose last step carried its step number, the share
    whose every turn one worker served (counted by the workers). ``load_spread``: the busiest
    worker's prompt tokens over the mean (1.0: even)."""
    affine = sum(r["programs_affine"] for r in rows)
    split = sum(r["programs_split"] for r in rows)
    tokens = [r["prompt_tokens"] for r in rows]
    mean = sum(tokens) / len(tokens) if tokens else 0.0
    return {
        "workers": len(rows),
        "program_affinity": affine / (affine + split) if affine + split else float("nan"),
        "load_spread": max(tokens) / mean if mean else float("nan"),
    }
