"""Tier 3: a real Prometheus scrapes the real server, and every panel of the Grafana dashboard
(``configs/grafana/continuum-dashboard.json``) answers with data, as Grafana would ask for it:
the dashboard's variables filled from Prometheus's own ``label_values``, ``$__rate_interval`` a
window of 30 s. Needs the ``prometheus`` binary (``scripts/setup.sh`` installs Debian's package
where it runs as root with apt-get)."""

import shutil
import subprocess
import time

import httpx
import pytest

from continuum_lab.harness.server import parse_metrics
from sglang_continuum.client.params import continuum_custom_params
from tests.support import free_port
from tests.unit.test_dashboard import instantiate, load, queries

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="no prometheus binary: scripts/setup.sh installs Debian's package (needs root and apt-get)",
    ),
]
SCRAPE_S = 1
# Prometheus 2.x asks for OpenMetrics without UTF-8 names, and the prometheus_client SGLang serves
# /metrics with writes `sglang:x` as `sglang_x` in that format's samples: the rule docs/metrics.md
# gives for Prometheus 2.x puts the server's names back
NAMES_BACK = (
    "    metric_relabel_configs:\n"
    "      - source_labels: [__name__]\n"
    '        regex: "sglang_(.+)"\n'
    "        target_label: __name__\n"
    '        replacement: "sglang:$1"\n'
)
RATE_WINDOW = "30s"
PROGRAMS, TURNS, PROMPT = 3, 3, 200


@pytest.fixture(scope="module")
def prometheus(continuum_server, tmp_path_factory):
    """Prometheus scraping the shared server every second, its HTTP API's URL."""
    home = tmp_path_factory.mktemp("prometheus")
    (home / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
        "scrape_configs:\n  - job_name: sglang\n    static_configs:\n"
        f'      - targets: ["127.0.0.1:{continuum_server.port}"]\n' + NAMES_BACK
    )
    port = free_port()
    log = (home / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: _ready(url), 30, f"Prometheus did not start ({home / 'prometheus.log'})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _until(done, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (found := done()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return found


def _query(url: str, expr: str) -> list:
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def _label_values(url: str, label: str, match: str) -> list[str]:
    """What Grafana's ``label_values(match, label)`` lists."""
    r = httpx.get(f"{url}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10)
    return r.json()["data"]


def _agent_traffic(url: str) -> list[int]:
    """A few programs of several turns, each out on a tool between turns (pinned, then hit), the
    last turn flagged: pins, pin hits, TTLs, ended programs, ids from custom_params. Token ids, so
    each turn continues the last one's context exactly. Returns the later turns' cached tokens."""
    contexts = {f"prom-{i}": [(31 * j + 7 * i) % 495 + 5 for j in range(PROMPT)] for i in range(PROGRAMS)}
    cached = []
    for turn in range(1, TURNS + 1):
        for pid, context in contexts.items():
            params = continuum_custom_params(pid, last_step=turn == TURNS, tool_name="bash", step=turn)
            sampling = {"max_new_tokens": 4, "ignore_eos": True, "custom_params": params}
            r = httpx.post(url + "/generate", json={"input_ids": context, "sampling_params": sampling}, timeout=120)
            assert r.status_code == 200, r.text
            out = r.json()
            if turn > 1:
                cached.append(out["meta_info"]["cached_tokens"])
            tool_output = [(13 * turn + j) % 495 + 5 for j in range(24)]
            contexts[pid] = context + out["output_ids"] + tool_output
        if turn == 1:  # every program out on its tool, pinned: SGLang counts that KV used, the plugin apart
            kv = _until(lambda: _pinned_kv(url), 10, "the pinned KV never showed in kv_pinned_reclaimable_tokens")
            assert kv["sglang:continuum_kv_request_tokens"] == 0, kv
        time.sleep(0.3)  # the tools' time
    return cached


def _pinned_kv(url: str) -> dict:
    """The server's gauges once the KV only pins hold covers these programs' first prompts
    (earlier tests' pins may add to it, never take from it)."""
    m = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    return m if m.get("sglang:continuum_kv_pinned_reclaimable_tokens", 0) >= PROGRAMS * PROMPT else {}


def test_every_dashboard_panel_answers_from_a_real_prometheus(quiet_server, prometheus):
    # scraped before the traffic, so the counters' rates see it grow
    _until(lambda: _query(prometheus, "sglang:continuum_info"), 30, "Prometheus never scraped the server")
    assert all(_agent_traffic(quiet_server.url)), "a later turn found its context gone"
    hits = f'sglang:continuum_pin_hits_total{{instance="127.0.0.1:{quiet_server.port}"}}'
    _until(lambda: _query(prometheus, f"increase({hits}[{RATE_WINDOW}]) > 0"), 30, "no pin hit reached Prometheus")
    _until(lambda: _query(prometheus, "sglang:time_to_first_token_seconds_count"), 30, "SGLang's TTFT never scraped")

    (instance,) = _label_values(prometheus, "instance", "sglang:continuum_info")
    (model_name,) = _label_values(prometheus, "model_name", f'sglang:continuum_info{{instance="{instance}"}}')
    assert model_name == quiet_server.cmd[quiet_server.cmd.index("--model-path") + 1]  # SGLang's label
    empty = []
    for title, expr in queries(load()):
        promql = instantiate(expr, instance=instance, model_name=model_name, rate_interval=RATE_WINDOW)
        if not _query(prometheus, promql):
            empty.append(f"{title}: {promql}")
    assert not empty, "panels with no data:\n" + "\n".join(empty)
