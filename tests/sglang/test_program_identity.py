"""Tier 2: where a request's program id comes from, with SGLang's real Scheduler in this process.

SGLang's routing key (``Req.routing_key``, from ``X-SMG-Routing-Key``) and the prefix itself
(``infer_programs``, on by default). A scheduler of its own: what the cost model learns about the
``unknown`` tool class (plain requests never return) must not leak in from other modules.
"""

import random

import pytest

from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler, release_parallel_runtime
from sglang_continuum.core.first_turns import FirstTurns
from sglang_continuum.core.metadata import INFERRED_PREFIX
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def driver(tiny_model):
    mp = pytest.MonkeyPatch()
    for key, value in fixed_ttl_env(60).items():
        mp.setenv(key, value)
    mp.setenv("SGLANG_CONTINUUM_CHECK_INTEGRITY", "1")
    sched = build_scheduler(tiny_model, max_total_tokens=1024)
    yield SchedulerDriver(sched)
    release_parallel_runtime()  # the next module may build its own scheduler in this process
    mp.undo()


def tokens(rng, n, vocab=500):
    return [rng.randrange(5, vocab) for _ in range(n)]


def meta(pid, last=False):
    return {"program_id": pid, "is_last_step": last}


def drain_pins(driver):
    cache = driver.s.tree_cache
    for pin in cache.controller.pins:
        cache.end_program(pin.program_id)


def no_first_turn_evidence(driver, return_s=60.0):
    """Nothing known yet of whether requests that continue nothing are agents' first turns."""
    driver.s.tree_cache.runtime.inference.first_turns = FirstTurns(return_s=return_s)


def test_routing_key_alone_makes_a_program_whose_next_turn_hits_its_pin(driver):
    """SGLang puts the X-SMG-Routing-Key header on ``Req.routing_key``: with no other id it is
    the program id (smg-routed traffic, bench_serving's routing keys)."""
    rng = random.Random(11)
    drain_pins(driver)
    cache = driver.s.tree_cache
    identity = cache.controller.identity
    before = (identity.routing_key, cache.controller.counters.hits)
    ctx = tokens(rng, 120)
    r1 = driver.submit(ctx, max_new_tokens=6, routing_key="rk-7")
    driver.run_until_idle()
    pin = cache.controller.pins.get("rk-7")
    assert pin is not None and pin.tokens == len(ctx) + 6 - 1
    previous = ctx + driver.output_ids(r1)
    r2 = driver.submit(previous + tokens(rng, 10), max_new_tokens=4, routing_key="rk-7")
    driver.run_until_idle()
    assert driver.req(r2).cached_tokens == len(previous) - 1
    assert (identity.routing_key, cache.controller.counters.hits) == (before[0] + 2, before[1] + 1)
    # a program id in custom_params wins over the routing key
    driver.submit(tokens(rng, 30), max_new_tokens=2, routing_key="rk-8", custom_params=meta("explicit", last=True))
    driver.run_until_idle()
    assert identity.routing_key == before[0] + 2 and "rk-8" not in cache.controller.programs
    drain_pins(driver)


def test_a_program_with_no_ids_is_inferred_from_its_prefix_and_hits_its_pin(driver):
    """No custom_params, session id or routing key. Turn 1 is served exactly as under fcfs (no
    program, no pin) but its context is remembered; turn 2's prompt extends it, so turn 2 is a
    turn of an inferred program (pinned when it finishes) and turn 3 is admitted onto that pin,
    even with the end of turn 2's output re-rendered differently. A request with an explicit id is
    never looked up."""
    rng = random.Random(12)
    drain_pins(driver)
    no_first_turn_evidence(driver)
    cache = driver.s.tree_cache
    controller, identity = cache.controller, cache.controller.identity
    before = (identity.inferred, identity.none, controller.counters.hits, controller.counters.created)
    ctx = tokens(rng, 150)
    r1 = driver.submit(ctx, max_new_tokens=6)
    driver.run_until_idle()
    tag1 = driver.req(r1)._continuum_tag
    assert tag1.meta.program_id is None and controller.counters.created == before[3]  # served as fcfs
    provisional = driver.req(r1)._continuum_first_turn
    assert provisional in cache.runtime.inference.index
    previous = ctx + driver.output_ids(r1)
    r2 = driver.submit(previous + tokens(rng, 12), max_new_tokens=4)
    driver.run_until_idle()
    tag2 = driver.req(r2)._continuum_tag
    pid = tag2.meta.program_id
    assert (pid, tag2.meta.source) == (provisional, "inferred")
    assert driver.req(r2).cached_tokens == len(previous) - 1  # unpinned, but nothing evicted it
    assert controller.pins.get(pid) is not None  # an inferred program's turn is pinned
    # turn 3 extends turn 2's context with the end of turn 2's output re-rendered differently
    out2 = driver.output_ids(r2)
    context2 = previous + driver.req(r2).origin_input_ids[len(previous) :].tolist()
    r3 = driver.submit(context2 + out2[:-1] + [3, 4], max_new_tokens=2)
    driver.run_until_idle()
    assert driver.req(r3)._continuum_tag.meta.program_id == pid
    assert driver.req(r3).cached_tokens >= len(context2) + len(out2) - 2
    assert (identity.inferred, identity.none, controller.counters.hits) == (before[0] + 2, before[1] + 1, before[2] + 1)
    # an explicit id extending the same context is its own program, and inference is not consulted
    lookups = cache.runtime.inference.index.attributed
    r4 = driver.submit(previous + tokens(rng, 12), max_new_tokens=2, custom_params=meta("explicit-4", last=True))
    driver.run_until_idle()
    assert driver.req(r4)._continuum_tag.meta.program_id == "explicit-4"
    assert cache.runtime.inference.index.attributed == lookups
    cache.end_program(pid)
    drain_pins(driver)
    cache.check_integrity()


def test_single_shot_requests_never_pin_and_are_forgotten_within_the_bound(driver):
    """Plain requests that nobody continues cost no pin, and what inference remembers of them
    stays within ``max_programs``."""
    rng = random.Random(13)
    drain_pins(driver)
    no_first_turn_evidence(driver)
    cache = driver.s.tree_cache
    created = cache.controller.counters.created
    for _ in range(6):
        driver.submit(tokens(rng, 40), max_new_tokens=2)
    driver.run_until_idle()
    assert cache.controller.counters.created == created and not len(cache.controller.pins)
    assert len(cache.runtime.inference._provisional) <= cache.runtime.inference.index.max_programs
    cache.check_integrity()


def test_once_first_turns_are_continued_a_first_turn_is_a_program_and_its_first_gap_is_pinned(driver):
    """An agent that sends nothing gets its first tool gap pinned, as with ids, once the traffic
    shows that requests which continue nothing are first turns: here one was continued, so the
    next such request is a new program from its first turn, pinned when it finishes, and its
    second turn is admitted onto the pin. When first turns stop being continued (single-shot
    traffic, past their return time), a new request is served as under fcfs again."""
    import time

    rng = random.Random(15)
    drain_pins(driver)
    no_first_turn_evidence(driver, return_s=0.2)
    cache = driver.s.tree_cache
    controller, identity = cache.controller, cache.controller.identity
    ctx = tokens(rng, 100)  # an earlier agent: its first turn is nobody's, its second continues it
    r1 = driver.submit(ctx, max_new_tokens=4)
    driver.run_until_idle()
    assert driver.req(r1)._continuum_tag.meta.program_id is None
    r2 = driver.submit(ctx + driver.output_ids(r1) + tokens(rng, 8), max_new_tokens=2)
    driver.run_until_idle()
    cache.end_program(driver.req(r2)._continuum_tag.meta.program_id)
    time.sleep(0.25)  # outcomes count a horizon (here 0.2 s) after the first turn finished
    before = (identity.first_turn, controller.counters.created, controller.counters.hits)
    ctx = tokens(rng, 140)
    r3 = driver.submit(ctx, max_new_tokens=6)
    driver.run_until_idle()
    tag3 = driver.req(r3)._continuum_tag
    pid = tag3.meta.program_id
    assert pid is not None and tag3.meta.source == "first_turn"
    assert controller.pins.get(pid) is not None  # the first tool gap is pinned
    previous = ctx + driver.output_ids(r3)
    r4 = driver.submit(previous + tokens(rng, 10), max_new_tokens=2)
    driver.run_until_idle()
    assert driver.req(r4)._continuum_tag.meta.program_id == pid
    assert driver.req(r4).cached_tokens == len(previous) - 1
    assert (identity.first_turn, controller.counters.hits) == (before[0] + 1, before[2] + 1)
    assert controller.counters.created == before[1] + 2  # turn 3's pin (hit) and turn 4's
    cache.end_program(pid)
    for _ in range(3):  # single-shot traffic now: taken as programs while the evidence says so...
        driver.submit(tokens(rng, 40), max_new_tokens=2)
    driver.run_until_idle()
    time.sleep(0.3)  # ... none continued within its return time
    r5 = driver.submit(tokens(rng, 40), max_new_tokens=2)
    driver.run_until_idle()
    assert driver.req(r5)._continuum_tag.meta.program_id is None  # 2 continued, 3 not
    assert not cache.runtime.inference.first_turns.are_programs()
    assert controller.program_counters.single_shot == 3  # dropped, their pins released
    drain_pins(driver)
    for pid in [s.program_id for s in list(controller.programs) if s.program_id.startswith(INFERRED_PREFIX)]:
        cache.end_program(pid)
    cache.check_integrity()


def test_sglang_health_probes_are_not_remembered_as_programs(driver):
    """``/health_generate`` sends a plain request with a ``HEALTH_CHECK`` rid: served as any
    request of no program, but inference neither attributes nor remembers it, and bounded waiting
    does not count it (an idle server answers one every few seconds: as 1-token admissions they
    would drag the mean prompt down until every admission of the next burst counted as hundreds
    of overtakes)."""
    from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX

    rng = random.Random(14)
    cache = driver.s.tree_cache
    bounded = cache.controller.bounded
    remembered = len(cache.runtime.inference._provisional)
    pace, mean = bounded.overtake_clock, bounded.mean_prompt
    rid = driver.submit(tokens(rng, 40), max_new_tokens=2, rid=f"{HEALTH_CHECK_RID_PREFIX}_probe")
    driver.run_until_idle()
    req = driver.req(rid)
    assert req.finished() and getattr(req, "_continuum_first_turn", None) is None
    assert len(cache.runtime.inference._provisional) <= remembered
    assert (bounded.overtake_clock, bounded.mean_prompt) == (pace, mean)
    driver.submit(tokens(rng, 40), max_new_tokens=2)  # the same request, not a probe: counted
    driver.run_until_idle()
    assert bounded.overtake_clock > pace
    cache.check_integrity()


def test_an_id_less_request_never_continues_another_scopes_context(driver):
    """With scoped traffic (the HTTP process writes each sender's scope), tenant B sending the very
    continuation of tenant A's context is not a turn of A's inferred program: it opens its own.
    A's own continuation still is A's, onto A's cached prefix."""
    from sglang_continuum.core.metadata import SCOPE_KEY, scope_of

    rng = random.Random(13)
    drain_pins(driver)
    no_first_turn_evidence(driver)
    cache = driver.s.tree_cache
    a, b = {SCOPE_KEY: scope_of("tenant-a")}, {SCOPE_KEY: scope_of("tenant-b")}
    ctx = tokens(rng, 140)
    r1 = driver.submit(ctx, max_new_tokens=6, custom_params=a)
    driver.run_until_idle()
    provisional = driver.req(r1)._continuum_first_turn
    assert provisional in cache.runtime.inference.index
    previous = ctx + driver.output_ids(r1)
    rb = driver.submit(previous + tokens(rng, 12), max_new_tokens=2, custom_params=b)
    driver.run_until_idle()
    tag_b = driver.req(rb)._continuum_tag
    assert tag_b.meta.program_id != provisional and tag_b.meta.source != "inferred"
    assert provisional in cache.runtime.inference.index  # A's record is untouched
    ra = driver.submit(previous + tokens(rng, 12), max_new_tokens=2, custom_params=a)
    driver.run_until_idle()
    tag_a = driver.req(ra)._continuum_tag
    assert (tag_a.meta.program_id, tag_a.meta.source) == (provisional, "inferred")
    assert driver.req(ra).cached_tokens >= len(previous) - 1
    cache.end_program(provisional)
    drain_pins(driver)
    cache.check_integrity()
