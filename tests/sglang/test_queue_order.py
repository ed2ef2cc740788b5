"""Tier 2: the incrementally kept waiting-queue order equals a fresh sort after any sequence of
arrivals, admissions, retractions, pin changes, expiries and overdue transitions (real SGLang
``Req`` objects, the real cache on CPU pools, a manual clock)."""

from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum_lab.harness.cpu_cache import TurnDriver, make_cache
from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.settings import ContinuumSettings
from tests.support import fixed_ttl_rules

pytestmark = pytest.mark.sglang

PROGRAMS = ["a", "b", "c", "d", None]  # None: a request without a program id
APPS = {"a": "app", "c": "app"}  # two agents of one application: they share its queue rank


@pytest.fixture(scope="module")
def sglang_globals(tiny_model):
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    args = ServerArgs(model_path=tiny_model, device="cpu", schedule_policy="continuum")
    args.resolve_once()
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))


def make_req(rid: str, program, tokens):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = {"program_id": program, **({"app_id": APPS[program]} if program in APPS else {})} if program else None
    return Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=4, custom_params=params))


ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.tuples(st.sampled_from(PROGRAMS), st.integers(0, 200))),
        st.tuples(st.just("admit"), st.integers(0, 50)),
        st.tuples(st.just("retract"), st.integers(0, 50)),
        st.tuples(st.just("pin"), st.sampled_from(PROGRAMS[:-1])),
        st.tuples(st.just("end"), st.sampled_from(PROGRAMS[:-1])),
        st.tuples(st.just("wait"), st.floats(0.0, 2.0)),
        st.tuples(st.just("flush"), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops)
def test_incremental_order_equals_a_fresh_sort(sglang_globals, script):
    from sglang_continuum.adapter.schedule_policy import ContinuumSchedulePolicy

    clock = ManualClock()
    settings_ = ContinuumSettings(rules=fixed_ttl_rules(1.5), max_overtakes=2, pin_budget_fraction=1.0)
    cache = make_cache(4096, settings=settings_, clock=clock)
    driver = TurnDriver(cache)
    policy = ContinuumSchedulePolicy(cache, False, False, False)
    policy.verify = True  # every calc_priority checks placed keys == fresh keys, and sortedness
    queue = []
    n = 0
    for op, arg in script:
        if op == "arrive":  # prompts of different lengths: admissions advance the overtaking clock unequally
            n += 1
            program, length = arg
            req = make_req(f"r{n}", program, [n % 500 + 1, 2, 3, *[4] * length])
            queue.append(req)
            cache.request_queued(req, waiting_ahead=len(queue) - 1)
            policy.requeued(req)
        elif op == "admit" and queue:
            req = queue.pop(arg % len(queue))
            cache.request_admitted(req)  # consumes its program's pin: other waiting keys change
        elif op == "retract" and queue:
            req = queue.pop(arg % len(queue))
            req.is_retracted = True
            cache.request_queued(req, waiting_ahead=len(queue))  # back in the queue: its wait restarts
            queue.append(req)
            policy.requeued(req)
        elif op == "pin":
            n += 1
            driver.run_turn(ProgramMeta(arg), [10_000 + n, 1, 2])
        elif op == "end":
            cache.end_program(arg)
        elif op == "wait":
            clock.advance(arg)
            cache.step(clock(), lambda pid: False)  # pins expire
        elif op == "flush":
            cache.reset()
        policy.calc_priority(queue)
    policy.calc_priority(queue)
    if any(req.sampling_params.custom_params for req in queue):
        keys = [cache.controller.priority_key(req._continuum_tag, req.is_retracted) for req in queue]
        assert keys == sorted(keys)
