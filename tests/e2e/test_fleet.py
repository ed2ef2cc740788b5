"""Tier 3: two CPU workers with the plugin behind SGLang's router (smg, consistent_hashing):
program affinity counted by the workers, pins hit on both, tool statistics shared over zmq, and a
killed worker does not stall the other."""

import asyncio
import os
import time

import httpx
import pytest

from continuum_lab.bench.replay import Replayer, replay
from continuum_lab.harness.fleet import Fleet, SmgRouter, fleet_summary, worker_table
from continuum_lab.harness.server import parse_metrics
from tests.e2e.conftest import ARGS, serving
from tests.e2e.test_bench import tiny_workload
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.e2e

# a pool whose pin budget (half) holds every pin the tests make, so each tool gap is pinned and hit
FLEET_ARGS = ["--max-total-tokens", "8192", *ARGS[2:]]
SENT = "sglang:continuum_stats_samples_sent_total"
RECEIVED = "sglang:continuum_stats_samples_received_total"


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory):
    env = fixed_ttl_env(25)
    logs = tmp_path_factory.mktemp("fleet")
    with Fleet(tiny_model, ["--schedule-policy", "continuum", *FLEET_ARGS], workers=2, env=env, log_dir=logs) as f:
        yield f
        for worker in f.workers:  # they keep nothing: stopped at once (a graceful stop waits ~5 s)
            worker.stop(graceful=False)


def scrape(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def test_consistent_hashing_keeps_programs_on_one_worker_and_pins_hit_on_both(fleet):
    programs = tiny_workload(n=8, turns=3)
    replayer = Replayer(fleet.url, seed=3, metrics_urls=fleet.worker_urls)
    result = asyncio.run(replayer.run(programs, 4.0))
    assert all(p.ok for p in result.programs), [t.error for p in result.programs for t in p.turns if t.error]
    rows = worker_table(result.worker_metrics)
    summary = fleet_summary(rows)
    assert summary["program_affinity"] == 1.0  # every program's 3 turns reached one worker
    assert sum(r["programs_affine"] for r in rows) == 8 and sum(r["programs"] for r in rows) == 8
    assert all(r["programs"] > 0 and r["pin_hits"] > 0 for r in rows), rows  # both workers serve and hit pins
    assert sum(r["pin_hits"] for r in rows) == 16  # two tool gaps per program, each pinned and hit
    for p in result.programs:  # later turns found their whole previous context cached
        assert all(b.cached_tokens >= a.prompt_tokens for a, b in zip(p.turns, p.turns[1:]))

    # the samples each worker recorded reached the other (counters flush at the idle step)
    def shared() -> bool:
        a, b = (scrape(u) for u in fleet.worker_urls)
        return a.get(SENT, 0) > 0 and b.get(SENT, 0) > 0 and a[SENT] == b[RECEIVED] and b[SENT] == a[RECEIVED]

    deadline = time.monotonic() + 30
    while not shared() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert shared(), [scrape(u) for u in fleet.worker_urls]


def test_round_robin_splits_programs_and_the_workers_count_it(fleet):
    # one program at a time, so nothing interleaves: its turns 1, 2, 3 go to workers A, B, A and
    # the worker that serves the last step saw only two of the three turns
    with SmgRouter(fleet.worker_urls, "round_robin") as router:
        for program in tiny_workload(n=3, turns=3):
            replayer = Replayer(router.url, seed=4, metrics_urls=fleet.worker_urls)
            result = asyncio.run(replayer.run([program], 4.0))
            assert all(p.ok for p in result.programs)
            rows = worker_table(result.worker_metrics)
            assert sum(r["programs_split"] for r in rows) == 1 and sum(r["programs_affine"] for r in rows) == 0, rows
            assert all(r["requests"] > 0 for r in rows), rows  # both workers served it


def test_a_killed_worker_does_not_stall_the_other(fleet):
    dead, alive = fleet.workers
    sent_before = scrape(alive.url).get(SENT, 0)
    dead.stop()
    result = replay(alive.url, tiny_workload(n=2, turns=3), jps=4.0, seed=5)
    assert all(p.ok for p in result.programs)
    deadline = time.monotonic() + 30  # it keeps publishing to a peer endpoint nobody serves
    while scrape(alive.url).get(SENT, 0) <= sent_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert scrape(alive.url).get(SENT, 0) > sent_before


def test_dp_ranks_keep_a_program_on_one_rank(tiny_model, tmp_path):
    """``--dp-size 2`` in one server: SGLang's round-robin dispatch would alternate a program's
    turns over the ranks; the plugin's hook routes every turn of a program to one rank."""
    cores = sorted(os.sched_getaffinity(0))
    env = {
        **fixed_ttl_env(25),
        # SGLang's CPU path gives each rank a NUMA node unless told which cores it has (one node here)
        "SGLANG_CPU_OMP_THREADS_BIND": f"{cores[0]}|{cores[-1]}",
    }
    args = ["--schedule-policy", "continuum", "--dp-size", "2", "--load-balance-method", "round_robin", *ARGS]
    with serving(tiny_model, args, env=env, log_path=tmp_path / "dp.log") as srv:
        before = parse_metrics(srv.metrics())
        result = replay(srv.url, tiny_workload(n=6, turns=3), jps=4.0, seed=6)
        after = parse_metrics(srv.metrics())
    assert all(p.ok for p in result.programs)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta("sglang:continuum_programs_affine_total") == 6 and delta("sglang:continuum_programs_split_total") == 0
    assert delta("sglang:continuum_pin_hits_total") == 12  # every later turn met its pin on its rank
    log = (tmp_path / "dp.log").read_text()
    assert "DP0" in log and "DP1" in log  # both ranks ran
