import pytest

from continuum_lab.harness.server import SGLangServer
from tests.support import fixed_ttl_env

POOL = 2048
ARGS = ["--max-total-tokens", str(POOL), "--enable-metrics", "--enable-cache-report", "--mem-fraction-static", "0.5"]


@pytest.fixture(scope="session")
def continuum_server(tiny_model, tmp_path_factory):
    """One CPU server with the plugin for the whole e2e tier (start-up is ~35 s on 2 cores)."""
    log = tmp_path_factory.mktemp("logs") / "continuum.log"
    # requests with no id are plain fillers here: continuing nothing, they are served as under fcfs
    env = {
        **fixed_ttl_env(25),
    }
    with SGLangServer(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=log) as srv:
        yield srv
