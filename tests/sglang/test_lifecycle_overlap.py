"""Tier 2: the lifecycle property of ``test_lifecycle.py`` under SGLang's overlap scheduling, the
loop a server runs by default: each step selects and launches a batch, then processes the results
of the batch launched before it. So a request can finish, be aborted or be retracted while a
result of it is still in flight, paths the serial loop never takes.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings

from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler, release_parallel_runtime
from tests.sglang.test_lifecycle import OPS, POOL, QUEUE_LIMIT, drain, meta, run_script, tokens
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def driver(tiny_model):
    mp = pytest.MonkeyPatch()
    for key, value in {**fixed_ttl_env(60), "SGLANG_CONTINUUM_MAX_OVERTAKES": "2"}.items():
        mp.setenv(key, value)
    sched = build_scheduler(tiny_model, max_total_tokens=POOL, max_queued_requests=QUEUE_LIMIT, overlap=True)
    yield SchedulerDriver(sched)
    release_parallel_runtime()
    mp.undo()


def test_the_driver_runs_sglangs_overlap_loop(driver):
    # a step launches the next batch before the last one's results are processed: the prefill's
    # output is not there after the step that launched it, only after the next one
    assert driver.overlap and driver.s.enable_overlap
    rid = driver.submit(tokens(random.Random(0), 40), max_new_tokens=3, custom_params=meta("overlap"))
    driver.step()
    assert rid in driver.admitted and driver.output_ids(rid) == [] and driver.in_flight is not None
    driver.step()
    assert len(driver.output_ids(rid)) == 1
    drain(driver)
    assert driver.req(rid).finished() and len(driver.output_ids(rid)) == 3


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=OPS)
def test_every_path_out_keeps_the_plugin_in_step_with_sglang_under_overlap(driver, script):
    """The serial test's script (``run_script``) on the overlap loop."""
    run_script(driver, script)
