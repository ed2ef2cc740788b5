"""Tier 2: a program's life as SGLang lives it. SGLang's real Scheduler, stepped in this process,
taken through every path a request can leave by: admission, finish, abort while waiting or
running, retraction (SGLang's own ``update_running_batch`` path, forced as ``SGLANG_TEST_RETRACT``
does), rejection at the queue limit. After each, the plugin's live requests are SGLang's and no
program stays in flight; and the admission bugs a read of the core found stay fixed.
"""

import contextlib
import random
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler, release_parallel_runtime
from sglang_continuum.adapter.request import get_tag
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.sglang
POOL = 1024
QUEUE_LIMIT = 4


@pytest.fixture(scope="module")
def driver(tiny_model):
    mp = pytest.MonkeyPatch()
    for key, value in {**fixed_ttl_env(60), "SGLANG_CONTINUUM_MAX_OVERTAKES": "2"}.items():
        mp.setenv(key, value)
    sched = build_scheduler(tiny_model, max_total_tokens=POOL, max_queued_requests=QUEUE_LIMIT)
    yield SchedulerDriver(sched)
    release_parallel_runtime()
    mp.undo()


def tokens(rng, n, vocab=500):
    return [rng.randrange(5, vocab) for _ in range(n)]


def meta(pid, tool="bash", last=False):
    return {"program_id": pid, "tool_name": tool, "is_last_step": last}


def live(s) -> set[str]:
    return s.policy.binding.live_rids()


def check(driver) -> None:
    """The plugin's live requests are SGLang's, and each program's turns in flight are its live ones."""
    driver.s.tree_cache.check_integrity(live(driver.s))


def drain(driver) -> None:
    driver.run_until_idle()
    check(driver)
    cache = driver.s.tree_cache
    assert not len(cache.lifecycle) and not any(p.in_flight for p in cache.controller.programs)
    assert cache.controller.pins.pinned_tokens <= cache.controller.pins.budget_tokens
    for program in list(cache.controller.programs):  # the next test starts with no programs, no pins
        cache.end_program(program.program_id)
    allocator = cache.token_to_kv_pool_allocator
    assert cache.protected_size() == 0  # no lock left behind
    assert allocator.available_size() + cache.evictable_size() == allocator.size  # no KV slot leaked


@contextlib.contextmanager
def retraction():
    """Make SGLang's next decode step retract (its own ``SGLANG_TEST_RETRACT`` switch)."""
    import sglang.srt.managers.scheduler as scheduler_module

    mp = pytest.MonkeyPatch()
    mp.setattr(scheduler_module, "TEST_RETRACT", True)
    mp.setattr(scheduler_module, "TEST_RETRACT_INTERVAL", 1)
    try:
        yield
    finally:
        mp.undo()


def test_a_retracted_turn_aborted_while_it_waits_again_leaves_nothing_in_flight(driver):
    from sglang.srt.managers.io_struct import AbortReq

    s, controller = driver.s, driver.s.tree_cache.controller
    rng = random.Random(1)
    rids = [driver.submit(tokens(rng, 60), max_new_tokens=40, custom_params=meta(f"retract-{i}")) for i in range(2)]
    driver.step()  # both admitted
    driver.step()  # decoding
    with retraction():
        driver.step()
    waiting = {r.rid for r in s.waiting_queue}
    retracted = [rid for rid in rids if rid in waiting]
    assert len(retracted) == 1 and driver.req(retracted[0]).is_retracted
    check(driver)
    pid = get_tag(driver.req(retracted[0])).meta.program_id
    assert controller.programs.get(pid).in_flight == 1
    s.abort_request(AbortReq(rid=retracted[0]))  # the client gives up while it waits again
    assert controller.programs.get(pid).in_flight == 0
    check(driver)
    drain(driver)


def test_a_request_rejected_at_the_queue_limit_never_arrived(driver):
    s, controller = driver.s, driver.s.tree_cache.controller
    rng = random.Random(2)
    first = tokens(rng, 40)
    rid = driver.submit(first, max_new_tokens=4, custom_params=meta("rejected", "grep"))
    driver.run_until_idle()
    state = controller.programs.get("rejected")
    samples = len(controller.stats.global_samples)
    fillers = [driver.submit(tokens(rng, 30), max_new_tokens=4) for _ in range(QUEUE_LIMIT)]
    assert all(f in {r.rid for r in s.waiting_queue} for f in fillers)
    again = first + driver.output_ids(rid) + tokens(rng, 10)
    rejected = driver.submit(again, max_new_tokens=4, custom_params=meta("rejected", "bash"))
    assert rejected not in {r.rid for r in s.waiting_queue}  # SGLang turned it away
    # no phantom arrival: no turn in flight, no tool-time sample, the pending tool call kept
    assert state.turns_arrived == 1 and state.in_flight == 0 and state.pending_tool == "grep"
    assert len(controller.stats.global_samples) == samples and controller.pins.get("rejected") is not None
    check(driver)
    drain(driver)


def test_a_pinned_turn_admitted_with_a_blocked_earlier_program_keeps_its_hit(driver):
    """The selection admits L's returning turn (its pin holds its prefix) and refuses E's, which
    arrived first but does not fit: the shed for E must not take the pin L's admitted turn holds,
    nor count it as lost (both feedback signals of the cost model would be biased)."""
    cache = driver.s.tree_cache
    controller = cache.controller
    rng = random.Random(3)
    ctx = {}
    for pid in ("early", "late"):
        ctx[pid] = tokens(rng, 100)
        rid = driver.submit(ctx[pid], max_new_tokens=4, custom_params=meta(pid))
        driver.run_until_idle()
        ctx[pid] += driver.output_ids(rid)
    cache._release([controller.shed("alloc", keep="late")])  # early's pin is gone; late's holds
    assert controller.pins.get("late") is not None and controller.pins.get("early") is None
    hits, sheds = controller.counters.hits, (controller.sheds.while_waiting, controller.sheds.admission)
    e2 = driver.submit(ctx["early"] + tokens(rng, 850), max_new_tokens=4, custom_params=meta("early", last=True))
    l2 = driver.submit(ctx["late"] + tokens(rng, 10), max_new_tokens=4, custom_params=meta("late", last=True))
    driver.step()
    assert l2 in driver.admitted and e2 not in driver.admitted
    assert controller.counters.hits == hits + 1
    assert (controller.sheds.while_waiting, controller.sheds.admission) == sheds
    drain(driver)


def test_an_overdue_first_turn_held_at_the_door_is_not_overtaken_by_smaller_ones(driver, monkeypatch):
    """A pinned program in flight leaves room for a small new program but not a large one. The
    large first turn, held at the door, becomes overdue; a smaller first turn arriving later would
    fit, and must wait behind it (before, it went in, and so could every small one after it)."""
    cache = driver.s.tree_cache
    controller = cache.controller
    rng = random.Random(4)
    # sized by today's contexts: the programs this module ended set no growth here
    monkeypatch.setattr(type(controller.door.working_set), "expected_final_context", property(lambda self: 0))
    request = driver.submit(tokens(rng, 500), max_new_tokens=4, custom_params=meta("resident"))
    driver.run_until_idle()
    assert controller.pins.get("resident") is not None  # in the working set: 500 of 1,024 tokens
    decode = driver.submit(tokens(rng, 20), max_new_tokens=150)  # the engine is busy: holding is allowed
    driver.step()
    big = driver.submit(tokens(rng, 600), max_new_tokens=4, custom_params=meta("big"))
    driver.step()
    assert big not in driver.admitted and get_tag(driver.req(big)).held_back
    # later arrivals admitted ahead of it until their prefill is worth two average prompts
    # (max_overtakes 2): overdue
    for _ in range(12):
        if controller.is_overdue(get_tag(driver.req(big))):
            break
        driver.submit(tokens(rng, 200), max_new_tokens=2)
        driver.step()
    assert controller.is_overdue(get_tag(driver.req(big)))
    small = driver.submit(tokens(rng, 300), max_new_tokens=4, custom_params=meta("small"))
    driver.step()
    driver.step()
    assert small not in driver.admitted and big not in driver.admitted
    assert get_tag(driver.req(small)).held_back
    assert not driver.req(decode).finished()
    cache.end_program("resident")  # room: the big one goes first
    driver.run_until_idle()
    assert driver.admitted.index(big) < driver.admitted.index(small) and driver.req(request).finished()
    check(driver)
    drain(driver)


def test_a_streaming_session_turn_leaves_when_the_session_keeps_its_kv(driver):
    """With a streaming session SGLang's session claims a finished turn's KV row before
    ``on_release``: the turn must leave the lifecycle there, with a decode running beside it so
    the idle fallback never runs."""
    from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput

    s, cache = driver.s, driver.s.tree_cache
    s.open_session(OpenSessionReqInput(session_id="stream", capacity_of_str_len=4096, streaming=True))
    rng = random.Random(5)
    busy = driver.submit(tokens(rng, 20), max_new_tokens=120)  # the scheduler never idles meanwhile
    for _ in range(2):
        rid = driver.submit(tokens(rng, 30), max_new_tokens=4, custom_params=meta("streamer"), session="stream")
        for _ in range(20):
            if driver.req(rid).finished():
                break
            driver.step()
        driver.step()
        assert driver.req(rid).finished() and not driver.req(busy).finished()
        assert cache.lifecycle.get(rid) is None
        assert cache.controller.programs.get("streamer").in_flight == 0
        check(driver)
    s.close_session(CloseSessionReqInput(session_id="stream"))
    drain(driver)


def test_a_request_sglang_aborts_before_it_runs_is_nobodys_turn(driver):
    """A prompt over the pool's limit is aborted by SGLang as it arrives (a one-token stand-in
    reaches the queue): it must not hit its program's pin, nor count as the program's turn, nor
    wait at the door as a first turn."""
    s, controller = driver.s, driver.s.tree_cache.controller
    rng = random.Random(6)
    ctx = tokens(rng, 200)
    rid = driver.submit(ctx, max_new_tokens=4, custom_params=meta("aborted-early"))
    driver.run_until_idle()
    state = controller.programs.get("aborted-early")
    pin, hits = controller.pins.get("aborted-early"), controller.counters.hits
    assert pin is not None and state.turns_arrived == 1
    busy = driver.submit(tokens(rng, 20), max_new_tokens=60)
    driver.step()
    too_long = ctx + driver.output_ids(rid) + tokens(rng, s.max_req_input_len)
    again = driver.submit(too_long, max_new_tokens=4, custom_params=meta("aborted-early"))
    fresh = driver.submit(tokens(rng, s.max_req_input_len + 5), max_new_tokens=4, custom_params=meta("new-too-long"))
    driver.step()
    driver.step()
    assert driver.req(again).finished() and driver.req(fresh).finished() and not driver.req(busy).finished()
    assert controller.counters.hits == hits and controller.pins.get("aborted-early") is pin
    assert state.turns_arrived == 1 and state.context_tokens >= 200
    assert "new-too-long" not in controller.programs
    check(driver)
    drain(driver)


def test_the_last_resort_shed_for_an_allocation_spares_a_turn_the_selection_took(driver):
    """``evict_for_alloc`` runs inside SGLang's selection, before the turns it took consume their
    pins: even its last resort must not shed one of those (it frees nothing the turn's own lock
    does not hold)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    s, cache = driver.s, driver.s.tree_cache
    controller = cache.controller
    rng = random.Random(7)
    for pid in ("taken", "other"):
        driver.submit(tokens(rng, 100), max_new_tokens=4, custom_params=meta(pid))
        driver.run_until_idle()
    binding = s.policy.binding
    binding.admission.taken.add("taken")
    try:
        cache.evict_for_alloc(EvictParams(num_tokens=cache.token_to_kv_pool_allocator.size * 2))
    finally:
        binding.admission.reset()
    assert controller.pins.get("taken") is not None and controller.pins.get("other") is None
    drain(driver)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 5), st.integers(20, 300)),  # program (5: no id), tokens
        st.tuples(st.just("step"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 50), st.just(0)),  # any live request
        st.tuples(st.just("retract"), st.just(0), st.just(0)),
        st.tuples(st.just("stream"), st.integers(0, 1), st.integers(20, 120)),  # a streaming session's turn
        st.tuples(st.just("too_long"), st.integers(0, 4), st.just(0)),  # aborted by SGLang as it arrives
        st.tuples(st.just("close"), st.integers(0, 4), st.just(0)),  # /close_session: the id may come back
        st.tuples(st.just("pause"), st.just(0), st.just(0)),  # pause_generation(retract), flush, continue
    ),
    max_size=25,
)


def run_script(driver, script) -> None:
    """Play ``script`` (``OPS``) on ``driver``: after every operation the plugin's live requests
    are SGLang's and each program's turns in flight are its live ones; once idle, nothing is in
    flight and every request that was taken in finished."""
    from sglang.srt.managers.io_struct import (
        AbortReq,
        CloseSessionReqInput,
        ContinueGenerationReqInput,
        OpenSessionReqInput,
        PauseGenerationReqInput,
    )

    s = driver.s
    rng = random.Random(len(script))
    submitted, aborted = [], set()
    sessions: dict[str, Optional[str]] = {}  # streaming sessions opened: their latest turn
    for op, a, b in script:
        if op == "submit":
            params = None if a == 5 else meta(f"prop-{a}")  # 5: a request with no program id
            submitted.append(driver.submit(tokens(rng, b), max_new_tokens=rng.randrange(2, 30), custom_params=params))
        elif op == "stream":  # the session id is the program id: closing it ends both
            sid = f"stream-{a}"
            if sid not in sessions:
                s.open_session(OpenSessionReqInput(session_id=sid, capacity_of_str_len=1 << 16, streaming=True))
                sessions[sid] = None
            last = sessions[sid]
            if last is None or driver.req(last).finished():  # a streaming client sends one turn at a time
                sessions[sid] = driver.submit(
                    tokens(rng, b), max_new_tokens=rng.randrange(2, 12), custom_params=meta(sid), session=sid
                )
                submitted.append(sessions[sid])
        elif op == "too_long":
            driver.submit(tokens(rng, s.max_req_input_len + 1), custom_params=meta(f"prop-{a}"))
        elif op == "close":
            s.close_session(CloseSessionReqInput(session_id=f"prop-{a}"))
        elif op == "step":
            for _ in range(a):
                driver.step()
        elif op == "abort":
            alive = sorted(live(s))
            if alive:
                aborted.add(alive[a % len(alive)])
                s.abort_request(AbortReq(rid=alive[a % len(alive)]))
        elif op == "retract" and len(s.running_batch.reqs) >= 2:
            with retraction():
                driver.step()
        elif op == "pause" and not driver.overlap:  # the driver, not SGLang's result queue, holds overlap's batch
            s.pause_generation(PauseGenerationReqInput(mode="retract"))
            s.flush_cache()  # succeeds only if nothing runs: retracted turns wait through it
            s.continue_generation(ContinueGenerationReqInput(torch_empty_cache=False))
        check(driver)
    driver.run_until_idle()
    for sid in sessions:  # a streaming session holds its last turn's KV until it closes
        s.close_session(CloseSessionReqInput(session_id=sid))
    drain(driver)
    for rid in submitted:  # taken in and not aborted: finished (the engine dropped nothing)
        req = driver.reqs.get(rid)
        assert req is None or rid in aborted or req.finished(), rid


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=OPS)
def test_every_path_out_keeps_the_plugin_in_step_with_sglang(driver, script):
    """Random arrivals (some past the queue limit, some over the pool's limit), streaming-session
    turns, steps, aborts of waiting and running requests, forced retractions, ``/close_session``
    mid-turn and ids used again, pause-retract with a flush while paused, on SGLang's serial loop
    (``run_script``)."""
    run_script(driver, script)


def test_a_request_that_reuses_a_live_requests_rid_is_served_without_touching_it(driver):
    """Request ids are unique per tokenizer manager, not across SGLang's entry points: a second
    request under the rid of one still waiting is served as a request without a program. It
    takes nothing of the first's (its record, its program's turn, its pin), and the scheduler loop
    never meets a request without a queue key."""
    rng = random.Random(17)
    cache = driver.s.tree_cache
    first = driver.submit(tokens(rng, 60), max_new_tokens=4, custom_params=meta("rid-owner"), rid="reused-rid")
    original = driver.reqs[first]
    driver.submit(tokens(rng, 60), max_new_tokens=4, custom_params=meta("rid-thief"), rid="reused-rid")
    duplicate = driver.reqs["reused-rid"]
    assert duplicate is not original and not get_tag(duplicate).meta.has_program
    assert cache.lifecycle.get("reused-rid").tag is get_tag(original) and cache.reused_rids == 1
    driver.run_until_idle()
    assert original.finished() and duplicate.finished()
    assert "rid-owner" in cache.controller.pins and "rid-thief" not in cache.controller.programs
    drain(driver)
