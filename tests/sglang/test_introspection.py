"""Tier 2: the live view's hook on SGLang's real ``Scheduler.get_internal_state`` (applied by the
plugin), with a stand-in scheduler around a real controller: the key it adds under continuum,
nothing under any other policy, and a failure that never reaches SGLang."""

import logging
from types import SimpleNamespace

import pytest

from sglang_continuum.adapter import introspection, plugin
from sglang_continuum.adapter.request import set_tag
from sglang_continuum.core.metadata import ProgramMeta
from tests.support import controller

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module", autouse=True)
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


class InternalState:
    """SGLang's ``SchedulerInternalStateController`` as the scheduler holds it: what it answers."""

    def get_internal_state(self, recv_req):
        from sglang.srt.managers.io_struct import GetInternalStateReqOutput

        return GetInternalStateReqOutput(internal_state={"max_total_num_tokens": 2048})


def scheduler(policy="continuum"):
    c, clock = controller(fixed_ttl_s=10.0)
    meta = ProgramMeta("agent-7", tool_name="bash", announces_end=True)
    tag = c.turn_arrived(meta)
    c.turn_admitted(tag, 100)
    c.turn_finished(meta, context_tokens=120, handle="lock", tag=tag)
    waiting = SimpleNamespace()
    set_tag(waiting, c.turn_arrived(ProgramMeta("agent-8", announces_end=True)))
    cache = SimpleNamespace(
        controller=c,
        step_clock=SimpleNamespace(read_source=clock),
        token_to_kv_pool_allocator=SimpleNamespace(size=2048),
        admission_capacity_tokens=lambda: 2048,
        ranks=SimpleNamespace(tp_rank=0),
    )
    no_tag = SimpleNamespace()  # a request the plugin never saw
    return SimpleNamespace(
        schedule_policy=policy, tree_cache=cache, waiting_queue=[waiting, no_tag], internal_state=InternalState()
    )


def ask(sched):
    from sglang.srt.managers.io_struct import GetInternalStateReq
    from sglang.srt.managers.scheduler import Scheduler

    return Scheduler.get_internal_state(sched, GetInternalStateReq()).internal_state


def test_the_hook_is_applied_to_the_schedulers_method():
    from sglang.srt.managers.scheduler import Scheduler

    assert Scheduler.get_internal_state.__wrapped__ is plugin._originals[plugin.INTERNAL_STATE]


def test_under_continuum_each_rank_answers_with_its_live_view_and_rank(monkeypatch):
    import sglang.srt.runtime_context as runtime_context
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput, msgpack_decode, msgpack_encode

    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(dp_rank=3))
    state = ask(scheduler())
    assert state["max_total_num_tokens"] == 2048  # SGLang's own answer, kept
    view = state[introspection.STATE_KEY]
    assert (view["server"]["dp_rank"], view["server"]["tp_rank"], view["server"]["pool_tokens"]) == (3, 0, 2048)
    rows = {row["id"]: row for row in view["programs"]}
    assert rows["agent-7"]["state"] == "tool" and rows["agent-7"]["last_decision"] == "pinned 10.0 s for bash"
    assert rows["agent-8"]["state"] == "waiting"
    # what SGLang's IPC carries from the scheduler to the HTTP process
    sent = msgpack_decode(msgpack_encode(GetInternalStateReqOutput(internal_state=state)))
    assert sent.internal_state[introspection.STATE_KEY] == view


def test_other_policies_answer_as_sglang_does(monkeypatch):
    monkeypatch.setattr(introspection, "scheduler_view", lambda s: pytest.fail("built for fcfs"))
    assert ask(scheduler("fcfs")) == {"max_total_num_tokens": 2048}


def test_a_view_that_fails_is_logged_once_and_the_answer_goes_back_without_it(monkeypatch, caplog):
    monkeypatch.setattr(introspection, "_failures", 0)
    broken = scheduler()
    broken.tree_cache.controller = None
    with caplog.at_level(logging.DEBUG, logger=introspection.__name__):
        assert ask(broken) == {"max_total_num_tokens": 2048}
        assert ask(broken) == {"max_total_num_tokens": 2048}
    levels = [r.levelno for r in caplog.records if r.name == introspection.__name__]
    assert levels == [logging.ERROR, logging.DEBUG]  # the traceback once, then a line at debug
