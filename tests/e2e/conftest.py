from contextlib import contextmanager

import pytest

from continuum_lab.harness.server import SGLangServer
from tests.support import fixed_ttl_env

POOL = 2048
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
        **fixed_ttl_env(25),
    }
    with serving(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=log) as srv:
        yield srv
