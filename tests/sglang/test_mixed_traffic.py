"""Tier 2: agents without ids beside one-shot prompts must not spoil the pool for programs after
them (issue 59), with SGLang's real Scheduler in this process on a manual clock.

The probe at small scale: a pool of 4,096 tokens, a fixed 5 s TTL, three 6-turn programs per
kind, five unrelated one-shot prompts without an id during each tool gap. Programs with explicit
ids run first on the fresh scheduler (the reference share), then programs with no id at all, then
explicit ids and routing keys again. Before the fix, the id-less agents' fast continuations made
every later one-shot prompt a "first turn" for a whole minute (their outcomes were still awaited),
and those pins, ranked before the next programs, cost them their budget.
"""

import random

import pytest

from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler, release_parallel_runtime
from sglang_continuum.core.clock import ManualClock, use_clock
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.sglang

CLOCK = ManualClock(1000.0)
POOL = 4096
TTL_S = 5.0
PROGRAMS, TURNS, SHOTS = 3, 6, 5
FIRST, APPEND, OUT, SHOT = 120, 40, 8, 900
GAP_S = 1.0


@pytest.fixture(scope="module")
def driver(tiny_model):
    mp = pytest.MonkeyPatch()
    for key, value in fixed_ttl_env(TTL_S).items():
        mp.setenv(key, value)
    with use_clock(CLOCK):
        sched = build_scheduler(tiny_model, max_total_tokens=POOL)
    yield SchedulerDriver(sched)
    release_parallel_runtime()
    mp.undo()


def idle(driver, seconds, tick=0.25):
    end = CLOCK() + seconds
    while CLOCK() < end:
        CLOCK.advance(tick)
        driver.step()


def one_shot_pins(driver, shots):
    pins = driver.s.tree_cache.controller.pins
    ids = {driver.req(r)._continuum_tag.meta.program_id for r in shots}
    return [p.program_id for p in pins if p.program_id in ids]


def run_programs(driver, rng, kind, tag, shots):
    """Three programs of ``kind`` side by side, one-shots in every tool gap; returns the share of
    later turns' prompts found cached."""
    ctx = [[rng.randrange(5, 500) for _ in range(FIRST)] for _ in range(PROGRAMS)]
    cached = total = 0
    for turn in range(1, TURNS + 1):
        rids = []
        for i in range(PROGRAMS):
            pid, kw = f"{tag}-{i}", {}
            if kind == "explicit":
                kw["custom_params"] = {"program_id": pid, "is_last_step": turn == TURNS}
            elif kind == "routing":
                kw["routing_key"] = pid
            rids.append(driver.submit(ctx[i], max_new_tokens=OUT, **kw))
        driver.run_until_idle()
        for i, rid in enumerate(rids):
            if turn > 1:
                cached += driver.req(rid).cached_tokens
                total += len(ctx[i])
            ctx[i] = ctx[i] + driver.output_ids(rid) + [rng.randrange(5, 500) for _ in range(APPEND)]
        if turn < TURNS:
            for _ in range(SHOTS):
                shots.append(driver.submit([rng.randrange(5, 500) for _ in range(SHOT)], max_new_tokens=OUT))
            driver.run_until_idle()
            idle(driver, GAP_S)
    return cached / total


def test_programs_after_id_less_agents_keep_their_share_and_one_shots_hold_no_pin(driver):
    rng = random.Random(59)
    cache = driver.s.tree_cache
    controller, first_turns = cache.controller, cache.inference.first_turns
    shots = []
    fresh = run_programs(driver, rng, "explicit", "fresh", shots)
    assert fresh > 0.8
    run_programs(driver, rng, "none", "none", shots)  # their turn 2 continues their turn 1 fast
    assert first_turns.horizon < 10.0  # read off their continuations, not the 60 s bound
    # a horizon later every one-shot of that phase is resolved: none is a program, none pinned
    idle(driver, first_turns.horizon)
    assert not first_turns.are_programs() and not one_shot_pins(driver, shots)
    assert controller.program_counters.single_shot == controller.identity.first_turn  # all dropped
    taken = controller.identity.first_turn
    for kind in ("explicit", "routing"):
        later = len(shots)
        share = run_programs(driver, rng, kind, f"after-{kind}", shots)
        assert share >= 0.9 * fresh, (kind, share, fresh)
        assert not one_shot_pins(driver, shots[later:])
    assert controller.identity.first_turn == taken  # no one-shot taken as a program since
    cache.check_integrity()
