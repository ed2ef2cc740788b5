"""Tier 2: SGLang's real Scheduler, built and stepped in this process, with the tiny model.

One scheduler for the module (building one takes ~15 s on 2 cores). It runs the default cost
model with warm-started statistics: tool "fast" always returns in 20 s, tool "slow" in 500 s, and
a steep prefill profile makes a hit worth ~1 s per context token, so the model pins "fast" turns
(for 20 s) and never "slow" ones.
"""

import itertools
import json
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler, release_parallel_runtime
from sglang_continuum.adapter.request import get_tag
from sglang_continuum.core.tool_stats import ToolStats

pytestmark = pytest.mark.sglang
POOL = 1024


@pytest.fixture(scope="module")
def driver(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("continuum")
    stats = ToolStats()
    for _ in range(150):
        stats.record("fast", 20.0)
        stats.record("slow", 500.0)
    stats_path = d / "stats.json"
    stats_path.write_text(json.dumps({"tool_stats": stats.to_dict()}))
    profile = d / "profile.json"
    profile.write_text(json.dumps({"name": "steep", "coeffs": [0.0, 1.0, 0.0]}))
    env = {
        "SGLANG_CONTINUUM_STATS_PATH": str(stats_path),
        "SGLANG_CONTINUUM_PREFILL_PROFILE": str(profile),
        "SGLANG_CONTINUUM_PIN_BUDGET_FRACTION": "0.6",
        # requests with no id are plain fillers here (test_program_identity.py covers inference)
    }
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    sched = build_scheduler(tiny_model, max_total_tokens=POOL)
    yield SchedulerDriver(sched)
    release_parallel_runtime()  # the next module may build its own scheduler in this process
    mp.undo()


def tokens(rng, n, vocab=500):
    return [rng.randrange(5, vocab) for _ in range(n)]


def meta(pid, tool=None, last=False):
    p = {"program_id": pid, "is_last_step": last}
    if tool:
        p["tool_name"] = tool
    return p


def drain_pins(driver):
    cache = driver.s.tree_cache
    for pin in cache.controller.pins:
        cache.end_program(pin.program_id)


def sized_by_todays_contexts(monkeypatch, controller):
    """The door weighs today's contexts: the programs this module ended set no expected growth."""
    monkeypatch.setattr(type(controller.door.working_set), "expected_final_context", property(lambda self: 0))


def keep_nobody_resident(monkeypatch, controller):
    """The TTL model alone prices pins: this module's prefill profile makes any rebuild dear, so a
    binding door would keep every program resident, slow tools and all."""
    monkeypatch.setattr(controller.residency, "resident_ttl", lambda tool, now, context_tokens: 0.0)


def test_plugin_objects_are_installed(driver):
    from sglang_continuum.adapter.radix_cache import ContinuumRadixCache
    from sglang_continuum.adapter.schedule_policy import ContinuumSchedulePolicy

    assert isinstance(driver.s.tree_cache, ContinuumRadixCache)
    assert isinstance(driver.s.policy, ContinuumSchedulePolicy)
    assert driver.s.tree_cache.controller.ttl_model.name == "cost"


def test_second_turn_hits_whole_context_after_pool_was_filled(driver):
    rng = random.Random(1)
    ctx = tokens(rng, 200)
    r1 = driver.submit(ctx, max_new_tokens=8, custom_params=meta("agent-1", "fast"))
    driver.run_until_idle()
    cache = driver.s.tree_cache
    assert cache.controller.pins.get("agent-1") is not None
    # other programs fill the pool during the tool gap
    fillers = [tokens(rng, 250) for _ in range(4)]
    for f in fillers:
        driver.submit(f, max_new_tokens=4)
    driver.run_until_idle()
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    from continuum_lab.harness.cpu_cache import key

    evicted = cache.match_prefix(MatchPrefixParams(key=key(fillers[0]))).device_prefix_len < 250
    assert evicted, "the fillers did not create memory pressure"
    previous = ctx + driver.output_ids(r1)
    r2 = driver.submit(previous + tokens(rng, 20), max_new_tokens=4, custom_params=meta("agent-1", last=True))
    driver.run_until_idle()
    # the last output token's KV is never computed, so the reusable context is one shorter
    assert driver.req(r2).cached_tokens == len(previous) - 1
    assert cache.controller.counters.hits >= 1 and "agent-1" not in cache.controller.pins


def test_the_door_learns_how_the_engine_spends_its_time_from_the_batches_that_ran(driver):
    """The decode share that prices a batch place (``core/engine_time.py``) is fed by the real
    loop: a prefill and a run of decode steps both count as busy time, the decode steps as decode.
    (A request with no program: an ended program would move the expected final context the later
    tests' door weighs.)"""
    controller = driver.s.tree_cache.controller
    engine = controller.residency.engine
    busy, decode = engine.busy_s, engine.decode_s
    steps, seen = engine.prefill.steps, engine.prefill.tokens
    driver.submit(tokens(random.Random(7), 300), max_new_tokens=24)
    driver.run_until_idle()
    assert engine.decode_s > decode, "no decode step was counted"
    assert engine.busy_s - engine.decode_s > busy - decode, "the prefill was not counted"
    # the prefill batch's new tokens (``ScheduleBatch.extend_lens``), one step of them
    assert engine.prefill.tokens - seen == pytest.approx(300, abs=0.05 * (300 + seen))
    assert engine.prefill.steps - steps == pytest.approx(1, abs=0.05 * (1 + steps))
    assert controller.ttl_model.engine is None  # a measured profile is configured: it prices rebuilds
    engine.check_integrity()


def test_slow_tool_is_not_pinned_and_its_prefix_is_lost_under_pressure(driver):
    rng = random.Random(2)
    ctx = tokens(rng, 200)
    driver.submit(ctx, max_new_tokens=8, custom_params=meta("agent-slow", "slow"))
    driver.run_until_idle()
    cache = driver.s.tree_cache
    assert cache.controller.pins.get("agent-slow") is None
    assert cache.controller.ttl_model.last.ttl == 0.0 and cache.controller.ttl_model.last.source == "tool"
    for _ in range(4):
        driver.submit(tokens(rng, 250), max_new_tokens=4)
    driver.run_until_idle()
    r2 = driver.submit(ctx + tokens(rng, 20), max_new_tokens=4, custom_params=meta("agent-slow", last=True))
    driver.run_until_idle()
    assert driver.req(r2).cached_tokens < 200


def test_waiting_queue_is_program_fcfs(driver):
    rng = random.Random(3)
    drain_pins(driver)
    pinned_ctx = tokens(rng, 60)
    a1 = driver.submit(pinned_ctx, max_new_tokens=4, custom_params=meta("A", "fast"))
    driver.run_until_idle()
    assert "A" in driver.s.tree_cache.controller.pins
    # Arrival order: E1, F1, X (no program), E2 (second request of E), A2 (A's next turn).
    e1 = driver.submit(tokens(rng, 30), custom_params=meta("E"))
    f1 = driver.submit(tokens(rng, 30), custom_params=meta("F"))
    x = driver.submit(tokens(rng, 30))
    e2 = driver.submit(tokens(rng, 30), custom_params=meta("E"))
    a2 = driver.submit(pinned_ctx + driver.output_ids(a1) + tokens(rng, 5), custom_params=meta("A", last=True))
    r = driver.submit(tokens(rng, 30))
    # A preempted request (engine flag) goes before everyone. SGLang sets the flag only on a
    # request it re-queues (which marks the order stale); flipping it in place needs mark_stale.
    driver.req(r).is_retracted = True
    driver.s.policy.mark_stale()
    driver.s.policy.calc_priority(driver.s.waiting_queue, driver.s.running_batch)
    assert [q.rid for q in driver.s.waiting_queue] == [r, a2, e1, e2, f1, x]
    driver.req(r).is_retracted = False  # no longer preempted: it queues by its own arrival
    driver.s.policy.mark_stale()
    start = len(driver.admitted)
    driver.run_until_idle()
    assert driver.admitted[start:] == [a2, e1, e2, f1, x, r]


def test_queue_without_program_ids_keeps_fcfs_order(driver):
    rng = random.Random(4)
    rids = [driver.submit(tokens(rng, 20)) for _ in range(5)]
    before = [q.rid for q in driver.s.waiting_queue]
    driver.s.policy.calc_priority(driver.s.waiting_queue, driver.s.running_batch)
    assert [q.rid for q in driver.s.waiting_queue] == before == rids
    driver.run_until_idle()


def test_garbage_metadata_is_served_like_fcfs(driver):
    rng = random.Random(5)
    bad = driver.submit(tokens(rng, 20), custom_params={"program_id": ["x"], "is_last_step": "perhaps"})
    driver.run_until_idle()
    assert driver.req(bad).finished() and len(driver.output_ids(bad)) == 4
    assert driver.s.tree_cache.report_malformed.count >= 1


def test_all_kv_returns_after_programs_end(driver):
    drain_pins(driver)
    cache = driver.s.tree_cache
    assert cache.protected_size() == 0
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache.evict(EvictParams(num_tokens=10**6))
    assert cache.token_to_kv_pool_allocator.available_size() == cache.token_to_kv_pool_allocator.size


def test_blocked_turn_of_an_earlier_program_sheds_a_later_programs_pin_while_a_decode_runs(driver):
    """Work-conserving pins: the queue head (program E, arrived first) needs memory that a later
    program's pin (L) holds while a long decode (X) runs. It is admitted in the step it is first
    considered, by shedding L's pin -- not after X finishes. A turn of a program that arrived
    after L (N) may not shed L's pin."""
    rng = random.Random(7)
    drain_pins(driver)
    cache = driver.s.tree_cache
    # earlier tests brought "slow" programs back within wall-clock milliseconds; on a fast machine
    # one such sample makes a tiny "slow" pin worth it. Restore the fixture's premise: never pinned.
    for _ in range(cache.controller.stats.window):
        cache.controller.stats.record("slow", 500.0)
    early = tokens(rng, 30)
    e1 = driver.submit(early, max_new_tokens=4, custom_params=meta("early", "slow"))  # E first; no pin
    driver.run_until_idle()
    early += driver.output_ids(e1)  # still cached when E comes back: it keeps E's place in the queue
    driver.submit(tokens(rng, 500), max_new_tokens=8, custom_params=meta("late", "fast"))  # pinned for 20 s
    driver.run_until_idle()
    assert "late" in cache.controller.pins and "early" not in cache.controller.pins, (
        {p.program_id: (p.tokens, p.deadline) for p in cache.controller.pins},
        cache.controller.counters,
        cache.controller.ttl_model.last,
    )
    x = driver.submit(tokens(rng, 50), max_new_tokens=300)  # a long decode
    for _ in range(3):
        driver.step()
    assert not driver.req(x).finished()
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() + cache.evictable_size() < 520, "no pressure: the test cannot fail"

    n = driver.submit(tokens(rng, 520), max_new_tokens=4, custom_params=meta("newer"))  # ranks after L
    for _ in range(3):
        driver.step()
    assert n not in driver.admitted and "late" in cache.controller.pins  # a later program waits for L
    sheds = cache.controller.admission.admission_sheds

    e2 = driver.submit(early + tokens(rng, 520 - len(early)), max_new_tokens=4, custom_params=meta("early", last=True))
    driver.step()
    assert e2 in driver.admitted and not driver.req(x).finished()  # admitted while X decodes
    assert "late" not in cache.controller.pins and cache.controller.admission.admission_sheds > sheds
    driver.run_until_idle()
    assert driver.req(n).finished() and driver.req(x).finished()
    cache.end_program("newer")
    cache.check_integrity()


FLEETS = itertools.count()
programs_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(20, 260), min_size=1, max_size=4),  # tokens each turn appends
        st.sampled_from(["fast", "slow"]),  # fast: pinned for 20 s; slow: never pinned
        st.integers(0, 6),  # tool gap, in scheduler steps
        st.integers(0, 4),  # arrival step
    ),
    min_size=2,
    max_size=6,
)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs=programs_strategy, seed=st.integers(0, 1000))
def test_random_agent_fleets_finish_without_leaks_and_pins_never_block_higher_ranked_turns(driver, programs, seed):
    """Random arrivals, tool gaps and sizes through the real scheduler: every request finishes,
    no step leaves a memory-blocked turn waiting while pins of later programs survive without
    being shed (unless that program's next turn waits too), pins stay within the budget (integrity check every step), no KV slot leaks."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    rng = random.Random(seed)
    fleet = next(FLEETS)  # program ids of their own: hypothesis reruns examples on the same scheduler
    drain_pins(driver)
    cache, policy = driver.s.tree_cache, driver.s.policy
    due = {i: arrival for i, (_, _, _, arrival) in enumerate(programs)}  # program -> step its next turn is sent
    turn = {i: 0 for i in range(len(programs))}  # next turn index
    contexts: dict[int, list[int]] = {i: [] for i in range(len(programs))}
    in_flight: dict[int, str] = {}
    step = 0
    while due or in_flight:
        for i in [i for i, at in due.items() if at <= step]:
            del due[i]
            appends, tool, _, _ = programs[i]
            contexts[i] = contexts[i] + tokens(rng, appends[turn[i]])
            last = turn[i] == len(appends) - 1
            in_flight[i] = driver.submit(
                contexts[i], max_new_tokens=4, custom_params=meta(f"fleet-{fleet}-{i}", None if last else tool, last)
            )
        sheds = cache.controller.admission.admission_sheds
        before = {id(p) for p in cache.controller.pins}  # pins made after this step's selection do not count
        driver.step()
        blocked = policy.binding.admission.blocked
        if blocked is not None:
            tag = blocked._continuum_tag
            # a pin whose program's next turn already waits is spared: shedding it throws away a
            # certain hit (issue 22), and the idle path sheds it anyway before the engine idles
            waiting = {get_tag(r).meta.program_id for r in driver.s.waiting_queue if get_tag(r) is not None}
            later = [
                p
                for p in cache.controller.pins
                if id(p) in before
                and p.arrival_rank > tag.program_rank
                and p.program_id != tag.meta.program_id
                and p.program_id not in waiting
            ]
            assert not later or cache.controller.admission.admission_sheds > sheds, (
                "a later program's pin kept out a blocked turn"
            )
        cache.check_integrity()
        step += 1
        for i, rid in list(in_flight.items()):
            if driver.req(rid).finished():
                del in_flight[i]
                contexts[i] = contexts[i] + driver.output_ids(rid)
                turn[i] += 1
                if turn[i] < len(programs[i][0]):
                    due[i] = step + programs[i][2]
        assert step < 3000, "the fleet did not finish"
    assert len(cache.controller.pins) == 0 and cache.protected_size() == 0
    cache.evict(EvictParams(num_tokens=10**6))
    assert cache.token_to_kv_pool_allocator.available_size() == cache.token_to_kv_pool_allocator.size


def test_shortfall_of_a_blocked_turn_counts_its_own_cached_prefix(driver, monkeypatch):
    """The memory a blocked turn lacks is measured while SGLang holds its prefix lock (the prefix
    is then out of the evictable budget, as SGLang counted it). Read afterwards, the shortfall was
    short by the turn's cached prefix, so shedding freed one pin per retry."""
    rng = random.Random(11)
    drain_pins(driver)
    cache = driver.s.tree_cache
    keep_nobody_resident(monkeypatch, cache.controller)
    for _ in range(cache.controller.stats.window):
        cache.controller.stats.record("slow", 500.0)
    for pid in ("first", "second"):  # earlier programs pin ~250 tokens each: a later turn may not shed them
        driver.submit(tokens(rng, 250), max_new_tokens=4, custom_params=meta(pid, "fast"))
        driver.run_until_idle()
    ctx = tokens(rng, 300)
    driver.submit(ctx, max_new_tokens=4, custom_params=meta("later", "slow"))  # cached, not pinned
    driver.run_until_idle()
    assert {"first", "second"} <= {p.program_id for p in cache.controller.pins} and "later" not in cache.controller.pins
    x = driver.submit(tokens(rng, 40), max_new_tokens=200)  # a decode runs: the engine is not idle
    for _ in range(2):
        driver.step()
    r = driver.submit(ctx + tokens(rng, 330), max_new_tokens=4, custom_params=meta("later", last=True))
    driver.step()
    req, admission = driver.req(r), driver.s.policy.binding.admission
    assert r not in driver.admitted and admission.blocked is req, "no pressure: the test cannot fail"
    allocator = cache.token_to_kv_pool_allocator
    prefix = req.prefix_len
    assert prefix >= 250  # its first turn's context is cached (evictable: nobody locks it)
    extend = len(req.full_untruncated_fill_ids) - prefix
    floor = extend + 4 - (allocator.available_size() + cache.evictable_size() - prefix)
    assert admission.shortfall >= floor > 0
    drain_pins(driver)  # the pins of earlier programs go: the turn is admitted
    driver.run_until_idle()
    assert driver.req(r).finished() and driver.req(x).finished()
    cache.check_integrity()


def test_priority_scheduling_is_refused_at_start_up(tiny_model):
    """SGLang's priority path re-sorts the queue under Continuum's incremental order: refused,
    naming the flag. Its own interpreter: SGLang builds its parallel runtime once per process."""
    code = (
        "from continuum_lab.harness.inprocess import build_scheduler\n"
        f"build_scheduler({tiny_model!r}, max_total_tokens={POOL}, enable_priority_scheduling=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "RuntimeError" in proc.stderr and "does not support --enable-priority-scheduling" in proc.stderr


def test_idle_hooks_still_run_while_sglang_sleeps_on_idle(driver, monkeypatch):
    """``--sleep-on-idle`` parks an idle loop in SGLang's ``IdleSleeper`` (a zmq poll of up to 1 s).
    While it sleeps with no request arriving, each wake-up still expires pins, flushes metrics and
    checks integrity. Runs last in the module: it moves the plugin's clock 25 s ahead for good."""
    import time

    from sglang.srt.managers.scheduler_components.idle_sleeper import IdleSleeper

    s = driver.s
    cache = s.tree_cache
    drain_pins(driver)
    # as Scheduler.init_idle_sleeper builds it with --sleep-on-idle (the module's scheduler has none)
    sleeper = IdleSleeper(sockets=[s.ipc_channels.recv_from_tokenizer, s.ipc_channels.recv_from_rpc])
    sleeps, calls = [], {"check": 0, "flush": 0}
    real_sleep = sleeper.maybe_sleep

    def timed_sleep():
        t0 = time.monotonic()
        real_sleep()
        sleeps.append(time.monotonic() - t0)

    sleeper.maybe_sleep = timed_sleep
    monkeypatch.setattr(s, "idle_sleeper", sleeper)
    check, flush = cache.check_integrity, cache.runtime.publish_metrics

    def counted_check(*args):
        calls["check"] += 1
        check(*args)

    def counted_flush(*a, **kw):
        calls["flush"] += kw.get("force", False)
        return flush(*a, **kw)

    monkeypatch.setattr(cache, "check_integrity", counted_check)
    monkeypatch.setattr(cache.runtime, "publish_metrics", counted_flush)

    rng = random.Random(11)
    driver.submit(tokens(rng, 200), max_new_tokens=4, custom_params=meta("sleeper", "fast"))  # pinned for 20 s
    driver.run_until_idle()
    assert "sleeper" in cache.controller.pins
    expired = cache.controller.counters.expired
    source = cache.step_clock._source
    cache.step_clock._source = lambda: source() + 25.0  # past the pin's deadline, with no request arriving
    for _ in range(3):
        assert not driver.step()  # idle: SGLang's on_idle sleeps in its poll (nothing wakes it)
    assert len(sleeps) >= 3 and max(sleeps) > 0.5, sleeps  # it really parked in the poll
    assert "sleeper" not in cache.controller.pins and cache.controller.counters.expired == expired + 1
    assert calls["check"] >= 1 and calls["flush"] >= 3, calls


def _idle_timeout_passes(controller, state) -> None:
    controller.programs.forget_idle(state.last_seen + controller.timings.program_idle_timeout_s + 1.0)


def test_a_turn_aborted_while_waiting_leaves_its_program_forgettable(driver):
    """A turn aborted in the waiting queue (client gone, queue limit, /abort_request) never
    reaches on_release, only the cache's finish(ABORT): its program must not stay in flight, or
    the registry (which keeps in-flight programs) would track it for ever."""
    from sglang.srt.managers.io_struct import AbortReq

    s, controller = driver.s, driver.s.tree_cache.controller
    rid = driver.submit(tokens(random.Random(11), 40), custom_params=meta("aborted-waiting"))
    state = controller.programs.get("aborted-waiting")
    assert rid in {r.rid for r in s.waiting_queue} and state.in_flight == 1
    s.abort_request(AbortReq(rid=rid))
    assert rid not in {r.rid for r in s.waiting_queue}
    assert state.in_flight == 0
    _idle_timeout_passes(controller, state)
    assert "aborted-waiting" not in controller.programs


def test_a_turn_that_left_the_queue_unseen_is_reported_then_ended_when_the_scheduler_idles(driver):
    """The fallback for a path SGLang might grow that tells the cache nothing: once the scheduler
    is fully idle, a request the plugin still holds live is a drift. With the integrity checks on
    (tests, debugging) it is reported; serving, it is ended as aborted."""
    s, cache = driver.s, driver.s.tree_cache
    controller = cache.controller
    rid = driver.submit(tokens(random.Random(12), 40), custom_params=meta("left-unseen"))
    s.waiting_queue.remove(driver.req(rid))  # gone, and nobody told the cache
    state = controller.programs.get("left-unseen")
    assert state.in_flight == 1
    with pytest.raises(AssertionError, match="live requests differ from SGLang's"):
        driver.step()  # nothing to run: the idle hooks
    mp = pytest.MonkeyPatch()
    mp.setattr(cache, "settings", cache.settings.model_copy(update={"check_integrity": False}))
    try:
        driver.step()
    finally:
        mp.undo()
    assert state.in_flight == 0 and not len(cache.lifecycle)
    _idle_timeout_passes(controller, state)
    assert "left-unseen" not in controller.programs


def test_a_turn_reaching_an_idle_scheduler_is_stamped_when_it_arrives(driver):
    """An idle SGLang loop (asleep in its poll with --sleep-on-idle) takes no step: a turn that
    arrives then must still read the time it arrived, or its tool time is measured short."""
    import time

    controller = driver.s.tree_cache.controller
    rng = random.Random(13)
    first = tokens(rng, 40)
    rid = driver.submit(first, custom_params=meta("idle-clock", tool="idleprobe"), max_new_tokens=2)
    driver.run_until_idle()
    time.sleep(0.5)  # the loop is idle: no step runs meanwhile
    driver.submit(
        first + driver.output_ids(rid) + tokens(rng, 8), custom_params=meta("idle-clock", last=True), max_new_tokens=2
    )
    measured = controller.stats.tool("idleprobe").samples()
    assert measured and measured[-1] >= 0.45, measured
    driver.run_until_idle()


def test_returning_turns_feed_the_return_loss_with_the_prefix_the_real_cache_found(driver):
    """The thrash signal reads SGLang's own prefix match at admission: a pinned program comes back
    to its whole context, an unpinned one whose KV the pool gave to others loses it."""
    rng = random.Random(21)
    drain_pins(driver)
    cache = driver.s.tree_cache
    meter = cache.controller.bounded.return_loss
    contexts = {}
    for pid, tool in (("rl-hit", "fast"), ("rl-miss", "slow")):  # fast: pinned; slow: never pinned
        contexts[pid] = tokens(rng, 200)
        rid = driver.submit(contexts[pid], max_new_tokens=4, custom_params=meta(pid, tool))
        driver.run_until_idle()
        contexts[pid] += driver.output_ids(rid)
    for _ in range(3):  # fillers with no program id take the whole pool: the unpinned context goes
        driver.submit(tokens(rng, POOL // 3), max_new_tokens=4)
    driver.run_until_idle()
    seen = meter.observed
    found = {}
    for pid in ("rl-hit", "rl-miss"):
        driver.submit(contexts[pid] + tokens(rng, 20), max_new_tokens=4, custom_params=meta(pid, last=True))
        driver.run_until_idle()
        found[pid] = cache.controller.last_admission.cached_tokens
    assert meter.observed == seen + 2
    assert found["rl-hit"] >= len(contexts["rl-hit"]) - 1  # its pin kept it (SGLang may not cache the last token)
    assert found["rl-miss"] < len(contexts["rl-miss"]) // 2  # gone: a loss the meter counted
    meter.check_integrity()


def test_a_return_whose_context_the_pool_gave_away_queues_after_cached_returns_before_new_programs(driver):
    """What a returning turn finds cached is read from the real cache as it arrives: one whose
    context is still there keeps its program's place; one whose context went to others re-prefills
    it anyway and goes after it, though its program arrived first, but before a new program."""
    rng = random.Random(23)
    drain_pins(driver)
    contexts = {}
    for pid in ("po-gone", "po-kept"):  # "slow": never pinned
        contexts[pid] = tokens(rng, 200)
        rid = driver.submit(contexts[pid], max_new_tokens=4, custom_params=meta(pid, "slow"))
        driver.run_until_idle()
        contexts[pid] += driver.output_ids(rid)
        if pid == "po-gone":  # fillers with no program id take the whole pool: its context goes
            for _ in range(3):
                driver.submit(tokens(rng, POOL // 3), max_new_tokens=4)
            driver.run_until_idle()
    new = driver.submit(tokens(rng, 30), max_new_tokens=4, custom_params=meta("po-new"))
    gone = driver.submit(
        contexts["po-gone"] + tokens(rng, 20), max_new_tokens=4, custom_params=meta("po-gone", last=True)
    )
    kept = driver.submit(
        contexts["po-kept"] + tokens(rng, 20), max_new_tokens=4, custom_params=meta("po-kept", last=True)
    )
    tags = {rid: driver.s.tree_cache.lifecycle.get(rid).tag for rid in (new, gone, kept)}
    assert [tags[r].context_gone for r in (new, gone, kept)] == [False, True, False]
    driver.s.policy.calc_priority(driver.s.waiting_queue, driver.s.running_batch)
    assert [q.rid for q in driver.s.waiting_queue] == [kept, gone, new]
    start = len(driver.admitted)
    driver.run_until_idle()
    assert driver.admitted[start:] == [kept, gone, new]
    driver.submit(tokens(rng, 10), max_new_tokens=2, custom_params=meta("po-new", last=True))
    driver.run_until_idle()


def test_admission_control_keeps_no_room_for_a_program_the_cost_model_let_go(driver, monkeypatch):
    """A program the cost model did not pin (its tool is slow) is out on that tool; a new program's
    first turn arrives while another request decodes. The unpinned context is no reason to hold the
    newcomer (it is not protected anyway): it is admitted at once."""
    rng = random.Random(32)
    drain_pins(driver)
    cache = driver.s.tree_cache
    controller = cache.controller
    for _ in range(controller.stats.window):  # the fixture's premise: "slow" is never pinned
        controller.stats.record("slow", 500.0)
    keep_nobody_resident(monkeypatch, controller)  # nor kept resident, if a test before left the door binding
    driver.submit(tokens(rng, 500), max_new_tokens=4, custom_params=meta("ws-out", "slow"))
    driver.run_until_idle()
    assert "ws-out" not in controller.pins and controller.door.working_set.tokens == 0
    x = driver.submit(tokens(rng, 20), max_new_tokens=200)  # a decode: holding back would not idle
    driver.step()
    newcomer = driver.submit(tokens(rng, 600), max_new_tokens=4, custom_params=meta("ws-new"))
    for _ in range(3):
        driver.step()
    assert not driver.req(x).finished() and newcomer in driver.admitted
    driver.run_until_idle()
    assert driver.req(newcomer).finished()
    for p in ("ws-out", "ws-new"):
        cache.end_program(p)
    cache.check_integrity()


def test_one_prefill_selection_does_not_let_a_wave_of_new_programs_past_the_door(driver, monkeypatch):
    """A pinned program (~400 tokens) is out on a tool and counted in the working set; two new
    programs' first turns (350 each) wait together while a decode runs. Either fits the 1,024-token
    pool beside the program in flight, both do not. SGLang's own budget could take both, and the
    working set hears of an admission only once the batch is formed: the door counts what the
    selection already took, so the wave does not go in together."""
    rng = random.Random(42)
    drain_pins(driver)
    cache = driver.s.tree_cache
    controller = cache.controller
    sized_by_todays_contexts(monkeypatch, controller)
    driver.submit(tokens(rng, 400), max_new_tokens=4, custom_params=meta("wave-old", "fast"))
    driver.run_until_idle()
    assert "wave-old" in controller.pins and controller.door.working_set.reserved_tokens() >= 400
    x = driver.submit(tokens(rng, 20), max_new_tokens=200)  # a decode: holding back would not idle
    driver.step()
    first = driver.submit(tokens(rng, 350), max_new_tokens=4, custom_params=meta("wave-1"))
    second = driver.submit(tokens(rng, 350), max_new_tokens=4, custom_params=meta("wave-2"))
    driver.step()
    assert first in driver.admitted and second not in driver.admitted
    assert get_tag(driver.req(second)).held_back
    driver.run_until_idle()
    assert driver.req(second).finished() and driver.req(x).finished()
    for p in ("wave-old", "wave-1", "wave-2"):
        cache.end_program(p)  # the next test starts from an empty working set
    cache.check_integrity()


def test_a_return_whose_context_was_evicted_is_paused_while_a_resident_program_fills_the_pool(driver, monkeypatch):
    """Residency without a host tier: a program out on a slow tool (never pinned) loses its context
    to the pool's LRU; its next turn returns while a resident program's pin and a decode fill the
    pool. The door pauses it at its turn boundary (held like a first turn, before SGLang's own
    budget is asked) rather than re-prefilling it over the resident one, and resumes it once the
    resident program leaves."""
    rng = random.Random(58)
    drain_pins(driver)
    cache = driver.s.tree_cache
    controller = cache.controller
    sized_by_todays_contexts(monkeypatch, controller)
    keep_nobody_resident(monkeypatch, controller)  # res-back's slow tool: never pinned
    driver.submit(tokens(rng, 560), max_new_tokens=4, custom_params=meta("res-old", "fast"))
    driver.run_until_idle()
    assert "res-old" in controller.pins
    first = tokens(rng, 300)
    driver.submit(first, max_new_tokens=4, custom_params=meta("res-back", "slow"))
    driver.run_until_idle()
    assert "res-back" not in controller.pins and "res-back" not in controller.door.working_set
    driver.submit(tokens(rng, 450), max_new_tokens=4)  # no id: a filler that evicts res-back's context
    driver.run_until_idle()
    paused_before = controller.admission.paused
    x = driver.submit(tokens(rng, 20), max_new_tokens=200)  # a decode: holding back would not idle
    driver.step()
    back = driver.submit(first + tokens(rng, 200), max_new_tokens=4, custom_params=meta("res-back", "slow"))
    for _ in range(3):
        driver.step()
    tag = get_tag(driver.req(back))
    assert tag.context_gone and tag.held_back and back not in driver.admitted
    assert controller.admission.paused == paused_before + 1
    cache.end_program("res-old")  # the resident program leaves: room
    for _ in range(3):
        driver.step()
    assert back in driver.admitted
    driver.run_until_idle()
    assert driver.req(back).finished() and driver.req(x).finished()
    cache.end_program("res-back")
    cache.check_integrity()


def test_the_first_turn_held_at_the_door_ends_the_selection_walk(driver, monkeypatch):
    """Thirty new programs wait while a pinned program and a decode fill the working set: the first
    of them fits and goes in, the second is held. A request without a program id that arrived
    after them is served in the same step (the door never holds it, so the walk goes on past the
    held ones to reach it); from then on no turn behind the held one is matched against the radix
    tree (SGLang's ``init_next_round_input``) on any step while it waits: no first turn would fit
    and nothing the door would let in waits behind, so the walk ends there, however many wait."""
    from sglang.srt.managers.schedule_batch import Req

    rng = random.Random(77)
    drain_pins(driver)
    cache = driver.s.tree_cache
    controller = cache.controller
    sized_by_todays_contexts(monkeypatch, controller)
    driver.submit(tokens(rng, 400), max_new_tokens=4, custom_params=meta("walk-old", "fast"))
    driver.run_until_idle()
    assert "walk-old" in controller.pins
    x = driver.submit(tokens(rng, 20), max_new_tokens=100)  # a decode: holding back would not idle
    driver.step()
    # each decodes for longer than the steps counted below: the first one admitted stays in flight
    firsts = [driver.submit(tokens(rng, 330), max_new_tokens=20, custom_params=meta(f"walk-{i}")) for i in range(30)]
    filler = driver.submit(tokens(rng, 20), max_new_tokens=4)  # no id, arrived last: the door never holds it
    driver.step()
    assert firsts[0] in driver.admitted and filler in driver.admitted  # the walk reached it behind them
    matched: dict[str, int] = {}
    original = Req.init_next_round_input

    def counted(self, *args, **kwargs):
        matched[self.rid] = matched.get(self.rid, 0) + 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Req, "init_next_round_input", counted)
    for _ in range(4):
        driver.step()
    assert get_tag(driver.req(firsts[1])).held_back and firsts[1] not in driver.admitted
    assert not any(matched.get(rid) for rid in firsts[2:]), "turns behind the held one were weighed"
    monkeypatch.setattr(Req, "init_next_round_input", original)
    cache.end_program("walk-old")
    driver.run_until_idle()
    assert all(driver.req(rid).finished() for rid in firsts) and driver.req(x).finished()
    for i in range(30):
        cache.end_program(f"walk-{i}")
    cache.check_integrity()


def held_beside_a_resident(driver, monkeypatch, rng, old: str, new: str):
    """A resident program ``old``'s pin (~560 tokens) and a decode fill the pool; a new program
    ``new``'s first turn (600 tokens) is held at the door, its bound (``max_hold_s``) 0.3 s.
    Returns the controller, ``old``'s first prompt and request, the decode's and the held turn's."""
    drain_pins(driver)
    controller = driver.s.tree_cache.controller
    sized_by_todays_contexts(monkeypatch, controller)
    monkeypatch.setattr(controller.residency, "max_hold_s", 0.3)
    first = tokens(rng, 560)
    r1 = driver.submit(first, max_new_tokens=4, custom_params=meta(old, "fast"))
    driver.run_until_idle()
    assert old in controller.pins
    x = driver.submit(tokens(rng, 20), max_new_tokens=200)  # a decode: holding back would not idle
    driver.step()
    held = driver.submit(tokens(rng, 600), max_new_tokens=4, custom_params=meta(new))
    for _ in range(2):
        driver.step()
    tag = get_tag(driver.req(held))
    assert tag.held_back and not tag.due and held not in driver.admitted
    return controller, first, r1, x, held


def test_a_first_turn_held_past_its_bound_is_served_while_a_resident_program_holds_the_pool(driver, monkeypatch):
    """Once the held first turn has waited its bound it is no longer held: blocked for memory, it
    sheds the resident pin (which SGLang's own admission would never do for a later program), the
    resident program leaves the working set, and the turn is served while the decode runs on
    (nothing preempted)."""
    import time

    controller, _, _, x, new = held_beside_a_resident(driver, monkeypatch, random.Random(91), "bound-old", "bound-new")
    tag, sheds = get_tag(driver.req(new)), controller.sheds.hold_bound
    time.sleep(0.35)
    for _ in range(4):
        driver.step()
    assert tag.due and new in driver.admitted
    assert controller.sheds.hold_bound == sheds + 1 and "bound-old" not in controller.pins
    assert "bound-old" not in controller.door.working_set
    assert not driver.req(x).finished()  # the decode ran on throughout
    driver.run_until_idle()
    assert driver.req(new).finished() and driver.req(x).finished()
    assert controller.residency.holds.longest(controller.clock()) == 0.0
    for p in ("bound-old", "bound-new"):
        driver.s.tree_cache.end_program(p)
    driver.s.tree_cache.check_integrity()


def test_a_turn_past_its_bound_sheds_a_resident_pin_whose_return_waits_behind_it(driver, monkeypatch):
    """As above, but the resident program's next turn arrives in the same step the held first turn
    comes due. The due turn goes ahead of that return in the queue and blocks it; the return's pin
    is all that holds the room the due turn waits for. Sparing it (a certain hit) would leave both
    waiting for the decode to finish; the bound sheds it once no other pin is left, the due turn is
    served while the decode runs on, and the return follows with its context rebuilt."""
    import time

    rng = random.Random(93)
    controller, first, r1, x, new = held_beside_a_resident(driver, monkeypatch, rng, "wait-old", "wait-new")
    tag, sheds = get_tag(driver.req(new)), controller.sheds.hold_bound
    time.sleep(0.35)
    back = driver.submit(
        first + driver.output_ids(r1) + tokens(rng, 8), max_new_tokens=4, custom_params=meta("wait-old", last=True)
    )
    for _ in range(4):
        driver.step()
    assert tag.due and new in driver.admitted
    assert controller.sheds.hold_bound == sheds + 1 and "wait-old" not in controller.pins
    assert not driver.req(x).finished()  # served before the decode ended: nothing waited for it
    driver.run_until_idle()
    assert all(driver.req(rid).finished() for rid in (new, back, x))
    for p in ("wait-old", "wait-new"):
        driver.s.tree_cache.end_program(p)
    driver.s.tree_cache.check_integrity()


def test_a_turn_that_does_not_fit_beside_its_own_programs_pin_is_served_on_an_idle_engine(driver):
    """A returning turn whose prompt keeps only part of its pinned context (a client that rewrites
    its history) and asks for more than fits beside that pin: on an idle engine nothing else is left
    to shed, so its own program's pin goes, rather than the turn waiting out the pin's TTL."""
    rng = random.Random(23)
    drain_pins(driver)
    cache = driver.s.tree_cache
    ctx = tokens(rng, 300)
    driver.submit(ctx, max_new_tokens=8, custom_params=meta("rewrites", "fast"))
    driver.run_until_idle()
    pin = cache.controller.pins.get("rewrites")
    assert pin is not None and pin.tokens >= 300
    idle_sheds = cache.controller.sheds.idle
    r = driver.submit(ctx[:50] + tokens(rng, 690), max_new_tokens=40, custom_params=meta("rewrites", last=True))
    driver.step()
    assert r in driver.admitted, "the turn waits behind its own program's pin on an idle engine"
    driver.run_until_idle()
    assert driver.req(r).finished() and "rewrites" not in cache.controller.pins
    assert cache.controller.sheds.idle == idle_sheds + 1
    cache.check_integrity()


def test_a_later_agent_of_an_earlier_application_is_admitted_before_a_later_applications_agent(driver):
    """Application-level FCFS in SGLang's own queue: app A's first agent ran before app B arrived;
    A's next agent, sent after B's, is placed ahead of it (program-level FCFS alone put it after)."""
    rng = random.Random(29)
    drain_pins(driver)
    driver.submit(tokens(rng, 40), max_new_tokens=2, custom_params={**meta("A/planner", last=True), "app_id": "A"})
    driver.run_until_idle()
    b = driver.submit(tokens(rng, 40), max_new_tokens=2, custom_params={**meta("B/planner", last=True), "app_id": "B"})
    a = driver.submit(tokens(rng, 40), max_new_tokens=2, custom_params={**meta("A/coder", last=True), "app_id": "A"})
    driver.run_until_idle()
    assert driver.req(a).finished() and driver.req(b).finished()
    assert driver.admitted.index(a) < driver.admitted.index(b)


def test_with_scoped_ids_a_tenants_first_turn_is_not_held_behind_anothers_burst(driver, monkeypatch):
    """Fair shares between scopes (``program_scope_header``) in SGLang's own queue: tenant A's six
    new programs wait at the door while a pinned program and a decode fill the working set (the
    first of them went in); tenant B's first turn arrives after them. Once room frees, B's goes in
    ahead of A's second: one program of each scope per round. By arrival alone it went last."""
    from sglang_continuum.core.metadata import SCOPE_KEY, scope_of, scoped_program_id
    from sglang_continuum.core.scopes import ScopeRanks

    rng = random.Random(113)
    drain_pins(driver)
    cache = driver.s.tree_cache
    controller = cache.controller
    sized_by_todays_contexts(monkeypatch, controller)
    monkeypatch.setattr(controller, "scopes", ScopeRanks(enabled=True))  # what the setting builds
    a, b = {SCOPE_KEY: scope_of("tenant-a")}, {SCOPE_KEY: scope_of("tenant-b")}
    driver.submit(tokens(rng, 400), max_new_tokens=4, custom_params=meta("fair-old", "fast"))
    driver.run_until_idle()
    assert "fair-old" in controller.pins
    x = driver.submit(tokens(rng, 20), max_new_tokens=100)  # a decode: holding back would not idle
    driver.step()
    burst = [
        driver.submit(tokens(rng, 330), max_new_tokens=8, custom_params={**meta(f"fa-{i}"), **a}) for i in range(6)
    ]
    driver.step()
    later = driver.submit(tokens(rng, 330), max_new_tokens=8, custom_params={**meta("fb-0"), **b})
    for _ in range(3):
        driver.step()
    assert burst[0] in driver.admitted and later not in driver.admitted and burst[1] not in driver.admitted
    cache.end_program("fair-old")  # room for the next one
    driver.run_until_idle()
    assert all(driver.req(rid).finished() for rid in [*burst, later, x])
    assert driver.admitted.index(later) < driver.admitted.index(burst[1])
    for scope, pid in [(a, f"fa-{i}") for i in range(6)] + [(b, "fb-0")]:
        cache.end_program(scoped_program_id(scope[SCOPE_KEY], pid))
    cache.check_integrity()
