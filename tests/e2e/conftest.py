import pytest

from continuum_lab.harness.server import SGLangServer

POOL = 2048
ARGS = ["--max-total-tokens", str(POOL), "--enable-metrics", "--enable-cache-report", "--mem-fraction-static", "0.5"]


@pytest.fixture(scope="session")
def continuum_server(tiny_model, tmp_path_factory):
    """One CPU server with the plugin for the whole e2e tier (start-up is ~35 s on 2 cores)."""
    log = tmp_path_factory.mktemp("logs") / "continuum.log"
    # requests with no id are plain fillers here: continuing nothing, they are served as under fcfs
    env = {
        "SGLANG_CONTINUUM_TTL_MODEL": "fixed",
        "SGLANG_CONTINUUM_FIXED_TTL_S": "25",
    }
    with SGLangServer(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=log) as srv:
        yield srv
