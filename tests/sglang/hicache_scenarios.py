"""Scenarios for ``test_hicache.py`` (each runs in its own interpreter: SGLang builds its parallel
runtime once per process, so a second in-process Scheduler cannot be made). Tier 2: Continuum with
SGLang's real HiCache (``init_hicache``, ``HybridCacheController``, host
pool, write-through/back, load back), in a real Scheduler stepped in this process.

Host and device pools are both CPU memory here; the CPU shim (docs/cpu-shim.md)
stands in for ``cudaHostRegister`` and the ``direct`` io backend's copy kernel only.

Each scenario: program P's turn 1 finishes and is pinned (fixed TTL 0.2 s); the pin expires while
P is out on its tool; other requests fill the device pool (P's prefix is evicted from the device);
P's turn 2 comes back. With Continuum the expired pin went to a protected host copy, so turn 2
loads its context back from host; under ``write_through_selective`` plain fcfs drops the
once-used prefix on eviction and turn 2 recomputes it.
"""

from __future__ import annotations

import os
import random
import sys

from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler
from sglang_continuum.core.clock import ManualClock, use_clock
from tests.support import fixed_ttl_env

# The plugin inside the real Scheduler runs on this clock (the clock seam): tool gaps and TTLs
# pass in virtual time, no test sleeps.
CLOCK = ManualClock(1000.0)

POOL = 1024
TTL_S = 0.2
HICACHE = dict(
    enable_hierarchical_cache=True,
    hicache_io_backend="direct",
    hicache_mem_layout="layer_first",
    hicache_ratio=2.0,
)


def tokens(rng, n, vocab=500):
    return [rng.randrange(5, vocab) for _ in range(n)]


def scheduler(tiny_model, policy: str, write_policy: str, env: dict) -> SchedulerDriver:
    os.environ.update({**fixed_ttl_env(TTL_S), **env})
    with use_clock(CLOCK):
        sched = build_scheduler(
            tiny_model, schedule_policy=policy, max_total_tokens=POOL, hicache_write_policy=write_policy, **HICACHE
        )
    return SchedulerDriver(sched)


def idle_steps(driver, seconds: float, tick: float = 0.02) -> None:
    """Step the scheduler while ``seconds`` of virtual time pass."""
    end = CLOCK() + seconds
    while CLOCK() < end:
        CLOCK.advance(tick)
        driver.step()


def fill_device(driver, rng) -> None:
    for _ in range(5):
        driver.submit(tokens(rng, 250), max_new_tokens=4)
    driver.run_until_idle()


def program_turns(driver, rng, pid: str, *, gap: callable):
    """Turn 1, ``gap`` (the tool call), turn 2 (last step). Returns (turn-1 context, turn-2 req)."""
    ctx = tokens(rng, 300)
    r1 = driver.submit(ctx, max_new_tokens=8, custom_params={"program_id": pid, "tool_name": "t"})
    driver.run_until_idle()
    gap()
    previous = ctx + driver.output_ids(r1)
    r2 = driver.submit(
        previous + tokens(rng, 20), max_new_tokens=4, custom_params={"program_id": pid, "is_last_step": True}
    )
    driver.run_until_idle()
    return previous, driver.req(r2)


def assert_nothing_held(cache) -> None:
    """No device or host slot leaks: once everything evictable is evicted, both pools are whole."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache.check_hicache_events()
    cache.writing_check(write_back=True)
    assert cache.protected_size() == 0
    cache.evict(EvictParams(num_tokens=10**6))
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() == allocator.size
    host = cache.cache_controller.mem_pool_host
    cache.evict_host(host.size)
    assert host.available_size() == host.size


def expired_pin_goes_to_host_and_next_turn_loads_it_back(tiny_model, write_policy):
    driver = scheduler(tiny_model, "continuum", write_policy, {})
    cache = driver.s.tree_cache
    assert cache.host_tier is not None and cache.host_tier.write_policy == write_policy
    # admission control fits the working set into what both tiers hold under this write policy
    host = int(cache.cache_controller.mem_pool_host.size)
    assert host >= 2 * POOL
    assert cache.admission_capacity_tokens() == (POOL + host if write_policy == "write_back" else host)
    rng = random.Random(7)
    seen = {}
    steps = []  # what each scheduler iteration told the engine's timings ran since the last one
    engine_step = cache.controller.residency.engine.step

    def timed(now, ran, prefilled=(0, 0)):
        steps.append((ran, prefilled))
        engine_step(now, ran, prefilled)

    cache.controller.residency.engine.step = timed

    def tool_call():
        pin = cache.controller.pins.get("P")
        assert pin is not None
        seen["node"] = pin.handle.node
        idle_steps(driver, TTL_S + 0.2)  # the pin expires while the tool runs: offloaded
        assert "P" not in cache.controller.pins
        host = cache.controller.host.pins.get("P")
        assert host is not None and cache.controller.host.counters.offloaded == 1
        cache.writing_check(write_back=True)  # let the backup land
        assert cache.tree_core.is_backuped(seen["node"])
        fill_device(driver, rng)
        assert not cache.host_tier.on_device(seen["node"]), "the fillers did not evict P's prefix"

    previous, turn2 = program_turns(driver, rng, "P", gap=tool_call)
    # served from host: loaded back, not recomputed (the last output token's KV never existed)
    assert turn2.host_loaded_length >= len(previous) - 1 - 8
    assert turn2.cached_tokens == len(previous) - 1
    counters = cache.controller.host.counters
    assert counters.host_hits == 1 and counters.host_hit_tokens == turn2.host_loaded_length
    # the prefill batch that waited on the load was reported with it: the engine's fit prices a reload
    timed_loads = [prefilled[2] for ran, prefilled in steps if ran is False and len(prefilled) > 2 and prefilled[2]]
    assert timed_loads == [turn2.host_loaded_length], timed_loads
    assert len(cache.controller.host.pins) == 0  # the last step released the host copy
    assert_nothing_held(cache)


def without_continuum_the_same_sequence_recomputes(tiny_model, write_policy):
    driver = scheduler(tiny_model, "fcfs", write_policy, {})
    rng = random.Random(7)
    previous, turn2 = program_turns(
        driver, rng, "P", gap=lambda: (idle_steps(driver, TTL_S + 0.2), fill_device(driver, rng))
    )
    assert turn2.host_loaded_length == 0
    assert turn2.cached_tokens < 50  # the prefix was dropped with its device copy
    assert_nothing_held(driver.s.tree_cache)


def hinted_return_finds_its_prefix_uploaded(tiny_model, write_policy):
    """Predictive upload: P's turn 1 says its tool takes 3 s (``tool_time_s``); its pin expires and
    its prefix is evicted to host; once the fillers are done the host copy is loaded back ahead of
    the return (another request's prefill batch runs the copy), so turn 2 finds its whole context on
    the device and loads nothing on its own path."""
    driver = scheduler(tiny_model, "continuum", write_policy, {"SGLANG_CONTINUUM_PREDICTIVE_UPLOAD": "1"})
    cache = driver.s.tree_cache
    uploads = cache.controller.uploads
    rng = random.Random(11)
    ctx = tokens(rng, 300)
    hint = {"program_id": "P", "tool_name": "t", "tool_time_s": 3.0}
    r1 = driver.submit(ctx, max_new_tokens=8, custom_params=hint)
    driver.run_until_idle()
    node = cache.controller.pins.get("P").handle.node
    idle_steps(driver, TTL_S + 0.2)
    assert cache.controller.host.pins.get("P") is not None
    cache.writing_check(write_back=True)
    fill_device(driver, rng)
    assert uploads.counters.started == 0 or cache.host_tier.on_device(node)
    idle_steps(driver, 0.2)  # no turn waits: the upload is priced free and queued
    assert uploads.counters.started == 1 and "P" in cache.controller.pins and "P" not in cache.controller.host.pins
    driver.submit(tokens(rng, 40), max_new_tokens=2)  # another prefill batch starts the copy
    driver.run_until_idle()
    assert not cache.cache_controller.load_queue and cache.host_tier.on_device(node)
    idle_steps(driver, 2.0)
    previous = ctx + driver.output_ids(r1)
    r2 = driver.submit(
        previous + tokens(rng, 20), max_new_tokens=4, custom_params={"program_id": "P", "is_last_step": True}
    )
    driver.run_until_idle()
    turn2 = driver.req(r2)
    assert turn2.host_loaded_length == 0, "the return loaded its prefix itself"
    assert turn2.cached_tokens == len(previous) - 1
    driver.step()
    assert uploads.counters.used == 1 and uploads.counters.wasted == 0
    cache.check_integrity()
    assert_nothing_held(cache)


def unhinted_cold_return_loads_its_prefix_itself(tiny_model, write_policy):
    """Without a hint and with no tool times learned yet, nothing is uploaded: SGLang's reactive
    load-back, as before predictive upload."""
    driver = scheduler(tiny_model, "continuum", write_policy, {"SGLANG_CONTINUUM_PREDICTIVE_UPLOAD": "1"})
    cache = driver.s.tree_cache
    rng = random.Random(11)

    def gap():
        idle_steps(driver, TTL_S + 0.2)
        cache.writing_check(write_back=True)
        fill_device(driver, rng)
        idle_steps(driver, 1.0)

    previous, turn2 = program_turns(driver, rng, "P", gap=gap)
    assert cache.controller.uploads.counters.started == 0
    assert turn2.host_loaded_length > 0


if __name__ == "__main__":
    scenario, model, policy = sys.argv[1:4]
    globals()[scenario](model, policy)
    print(f"scenario {scenario} ({policy}) passed")
