"""SGLang 0.5.23's own benchmark client (``python -m sglang.bench_serving``) against a continuum
server: it sends no program ids, so programs must be inferred from the prefix (agentic-trace
replay) or come from the routing key (generated-shared-prefix with ``--gsp-send-routing-key``);
later rounds hit pins, and with a short fixed TTL nothing stays pinned afterwards."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from continuum_lab.harness.server import parse_metrics
from tests.e2e.conftest import ARGS, serving
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.e2e
TRACE = Path(__file__).resolve().parents[1] / "data" / "bench_serving_agentic_trace_3x4.json"  # 3 conv x 4 rounds
TTL_S = 4
M = "sglang:continuum_"


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """Its own server, so the settings are known: fixed short TTL, inference on (the default)."""
    log = tmp_path_factory.mktemp("logs") / "bench-serving.log"
    env = fixed_ttl_env(TTL_S)
    with serving(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=log) as srv:
        yield srv


def bench_serving(server, tiny_model, tmp_path, *args: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        server.url,
        "--model",
        tiny_model,
        "--tokenizer",
        tiny_model,
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--output-file",
        str(tmp_path / "bench.jsonl"),
        *args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def wait_unpinned(server, timeout_s: float = 30.0) -> dict:
    """Pins expire TTL_S after their turn: poll until none is left (or give up and return)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = parse_metrics(server.metrics())
        if (m[M + "pinned_programs"] == 0 and m[M + "pinned_tokens"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.5)


def delta(after: dict, before: dict, name: str) -> float:
    return after.get(M + name, 0.0) - before.get(M + name, 0.0)


def test_agentic_trace_programs_are_inferred_and_hit_pins(server, tiny_model, tmp_path):
    before = parse_metrics(server.metrics())
    out = bench_serving(
        server,
        tiny_model,
        tmp_path,
        "--dataset-name",
        "agentic-trace",
        "--dataset-path",
        str(TRACE),
        "--num-prompts",
        "3",
        "--sharegpt-output-len",
        "8",
        "--max-concurrency",
        "3",
    )
    assert "Successful requests:                     12" in out, out[-3000:]  # 3 conversations x 4 rounds
    after = parse_metrics(server.metrics())
    # Round 1 of each conversation continues nothing (served as under fcfs, remembered
    # provisionally); rounds 2-4 extend it: inferred, pinned at their finish, the next round hits.
    assert delta(after, before, 'requests_total{id_source="inferred"}') >= 3 * 2, after
    assert delta(after, before, "pin_hits_total") >= 3, after
    assert delta(after, before, 'requests_total{id_source="routing_key"}') == 0
    done = wait_unpinned(server)
    # (programs_in_flight is a 30 s sliding window of programs seen, not held state: not checked)
    assert done[M + "pinned_programs"] == 0 and done[M + "pinned_tokens"] == 0, done


def test_generated_shared_prefix_routing_key_is_the_program(server, tiny_model, tmp_path):
    before = parse_metrics(server.metrics())
    out = bench_serving(
        server,
        tiny_model,
        tmp_path,
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "1",
        "--gsp-num-turns",
        "3",
        "--gsp-system-prompt-len",
        "96",
        "--gsp-question-len",
        "16",
        "--gsp-output-len",
        "8",
        "--gsp-send-routing-key",
        "--num-prompts",
        "2",
    )
    assert "Successful requests:                     6" in out, out[-3000:]  # 2 conversations x 3 rounds
    after = parse_metrics(server.metrics())
    # One routing key per conversation, sent on every round (X-SMG-Routing-Key): it is the id.
    assert delta(after, before, 'requests_total{id_source="routing_key"}') == 6, after
    assert delta(after, before, 'requests_total{id_source="inferred"}') == 0
    assert delta(after, before, "pin_hits_total") >= 2 * 2, after  # rounds 2 and 3 of both
    done = wait_unpinned(server)
    assert done[M + "pinned_programs"] == 0 and done[M + "pinned_tokens"] == 0, done
