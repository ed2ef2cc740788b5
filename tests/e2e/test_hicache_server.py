"""Tier 3: a real CPU server with ``--schedule-policy continuum --enable-hierarchical-cache``.

A 3-turn program whose tool calls outlive its TTL: each expired pin goes to a protected host copy,
other requests push the prefix off the device, and the next turn loads it back from host. The
write policy is ``write_through_selective``, under which SGLang alone would drop a once-used
prefix on eviction (``tests/sglang/test_hicache.py`` shows that side).
"""

import random
import time

import httpx
import pytest

from continuum_lab.bench.policies import HICACHE_CPU_FLAGS
from continuum_lab.harness.server import parse_metrics
from sglang_continuum.client import continuum_custom_params
from tests.e2e.conftest import serving
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.e2e
POOL = 2048
TTL_S = 0.3


def generate(client: httpx.Client, ids: list[int], max_new: int, **meta) -> dict:
    sp = {"max_new_tokens": max_new, "ignore_eos": True}
    if meta:
        sp["custom_params"] = continuum_custom_params(**meta)
    r = client.post("/generate", json={"input_ids": ids, "sampling_params": sp})
    r.raise_for_status()
    return r.json()


def offloaded(client: httpx.Client, n: int, timeout_s: float = 20.0) -> None:
    """Until ``n`` pins have gone to host (``offloads_total``), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while parse_metrics(client.get("/metrics").text).get("sglang:continuum_offloads_total", 0) < n:
        if time.monotonic() > deadline:
            return  # the assertions below say what did not happen
        time.sleep(0.1)


def test_three_turn_program_gets_its_prefix_back_from_host(tiny_model, tmp_path):
    args = [
        "--schedule-policy",
        "continuum",
        "--max-total-tokens",
        str(POOL),
        "--enable-metrics",
        "--enable-cache-report",
        "--enable-hierarchical-cache",
        "--hicache-write-policy",
        "write_through_selective",
        *HICACHE_CPU_FLAGS,
    ]
    env = fixed_ttl_env(TTL_S)
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(5, 500) for _ in range(n)]  # noqa: E731
    with (
        serving(tiny_model, args, env=env, log_path=tmp_path / "server.log") as srv,
        httpx.Client(base_url=srv.url, timeout=120) as client,
    ):
        context = ids(500)
        host_cached = []
        for turn in range(3):
            last = turn == 2
            out = generate(client, context, 8, program_id="agent", last_step=last, tool_name=None if last else "bash")
            if turn:
                host_cached.append(out["meta_info"].get("cached_tokens_details") or {})
            if last:
                break
            time.sleep(TTL_S + 0.5)  # the tool outlives the TTL: the pin expires and is offloaded
            # ... which the idle loop does within about a second, later on a loaded machine: the tool
            # lasts until /metrics shows it (else the fillers below would meet the pin still held)
            offloaded(client, turn + 1)
            for _ in range(4):  # other programs push the prefix off the device
                generate(client, ids(600), 2)
            context = context + out["output_ids"] + ids(30)
        # /metrics is current once the engine rests (series refresh at most every
        # METRICS_INTERVAL_S while serving, and at every idle iteration): a scrape right after
        # the last response can precede that, so poll until the program's end and release show
        # (counters are written before gauges, so the released gauge comes with the hit counts)
        deadline = time.monotonic() + 20
        while True:
            metrics = parse_metrics(client.get("/metrics").text)
            ended = metrics.get('sglang:continuum_programs_ended_total{reason="last_step"}') == 1
            if (ended and metrics.get("sglang:continuum_host_pinned_programs") == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    # turns 2 and 3 found their previous context on host (the last output token has no KV yet)
    assert all(d.get("host", 0) >= 500 for d in host_cached), host_cached
    assert metrics["sglang:continuum_offloads_total"] == 2
    assert metrics["sglang:continuum_host_hits_total"] == 2
    assert metrics["sglang:continuum_host_hit_tokens_total"] >= 1000
    assert metrics["sglang:continuum_host_pinned_programs"] == 0  # the last step released it
