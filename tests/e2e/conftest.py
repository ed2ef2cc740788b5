import time
from contextlib import contextmanager

import httpx
import pytest

from continuum_lab.harness.server import SGLangServer, parse_metrics
from tests.support import fixed_ttl_env

POOL = 2048
TTL_S = 25  # the shared server's fixed pin TTL: what a program ended by silence leaves pinned
ARGS = ["--max-total-tokens", str(POOL), "--enable-metrics", "--enable-cache-report", "--mem-fraction-static", "0.5"]


@contextmanager
def serving(model: str, args, **kwargs):
    """``with SGLangServer(...)``, but stopped with SIGKILL: for a server whose results are read
    before the block ends and that keeps no state (no stats file). A graceful stop waits ~5 s
    for SGLang's watchdog to notice the SIGTERM; a test that asserts on the stop itself
    (``test_sigterm_to_the_launcher_alone_saves_the_statistics``) stops its server its own way."""
    srv = SGLangServer(model, args, **kwargs).start()
    try:
        yield srv
    finally:
        srv.stop(graceful=False)


@pytest.fixture(scope="session")
def continuum_server(tiny_model, tmp_path_factory):
    """One CPU server with the plugin for the whole e2e tier (start-up is ~35 s on 2 cores)."""
    log = tmp_path_factory.mktemp("logs") / "continuum.log"
    # requests with no id are plain fillers here: continuing nothing, they are served as under fcfs
    env = {
        **fixed_ttl_env(TTL_S),
    }
    with serving(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=log) as srv:
        yield srv


QUIET = ("programs_in_flight", "pinned_programs")


def wait_until(server, gauges=QUIET, timeout_s: float = TTL_S + 15) -> dict:
    """Poll until each ``sglang:continuum_<gauge>`` reads 0; returns those that did not (empty once
    quiet). The shared server carries what earlier tests left: a program ended by silence (Claude
    Code's, an id-less agent's) keeps its pin for the TTL. An idle scheduler refreshes no gauge and
    expires no pin, so a one-token id-less request makes it step; too short to continue any
    recorded context, it is no program's turn."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = parse_metrics(server.metrics())
        left = {g: metrics.get("sglang:continuum_" + g, 0) for g in gauges}
        left = {g: v for g, v in left.items() if v != 0}
        if not left or time.monotonic() > deadline:
            return left
        httpx.post(server.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 1}}, timeout=60)
        time.sleep(0.5)


@pytest.fixture
def quiet_server(continuum_server):
    """The shared server once no program of an earlier test is in flight or pinned: for a
    test that asserts on absolute gauges."""
    left = wait_until(continuum_server)
    assert not left, f"what earlier tests left on the shared server: {left}"
    return continuum_server
