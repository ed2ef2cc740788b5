"""Program ids no other client can use: inferred ids in a namespace clients cannot send, ids scoped
to the sender's credential or tenant header, ``/close_session`` ending only the sender's program,
and SGLang's queue limit never refusing an admitted program's return for first turns the door holds.
The plugin's hooks are called as SGLang calls them, with stand-ins for SGLang's objects."""

from types import SimpleNamespace

import pytest

from sglang_continuum.adapter import plugin
from sglang_continuum.adapter.inference import ProgramInference
from sglang_continuum.adapter.request import set_tag
from sglang_continuum.core.metadata import (
    NO_PROGRAM,
    RESERVED_PREFIX,
    SCOPE_KEY,
    MalformedReporter,
    ProgramMeta,
    parse_program_meta,
    scope_of,
)
from sglang_continuum.core.turns import TurnTag


def pid_of(custom_params=None, **ids):
    return parse_program_meta(custom_params, report=lambda pid, why: None, **ids).program_id


def scoped(tenant, client_id):
    return pid_of({"program_id": client_id, SCOPE_KEY: scope_of(tenant)})


def inferred_id() -> str:
    return ProgramInference(alive=lambda pid: False, clock=lambda: 0.0).index.new_program()


@pytest.mark.parametrize("source", ["program_id", "job_id", "session_id", "routing_key"])
def test_an_id_in_the_plugins_namespace_is_malformed_from_every_source(source):
    """Sending an inferred program's id (or a scoped one) would join that program: refused as
    malformed, reported, and the request served as if it carried no id."""
    problems = []
    report = lambda p, why: problems.append(why)  # noqa: E731
    for pid in (inferred_id(), f"  {inferred_id()} ", scoped("tenant-b", "run-1")):
        problems.clear()
        if source in ("program_id", "job_id"):
            meta = parse_program_meta({source: pid}, report=report)
        else:
            meta = parse_program_meta(None, report=report, **{source: pid})
        assert meta is NO_PROGRAM
        assert len(problems) == 1 and "reserved" in problems[0]


def test_inferred_ids_are_made_where_no_client_id_can_land():
    made = inferred_id()
    assert made.startswith(RESERVED_PREFIX)
    number = made.rsplit("-", 1)[1]
    for guess in (f"inferred-{number}", made.removeprefix(RESERVED_PREFIX), number):
        assert pid_of({"program_id": guess}) not in (None, made)  # its own program, not the inferred one


def test_the_same_client_id_from_two_tenants_is_two_programs_from_every_source():
    a, b = scoped("Bearer key-a", "run-1"), scoped("Bearer key-b", "run-1")
    assert len({a, b, "run-1"}) == 3
    scope = {SCOPE_KEY: scope_of("Bearer key-a")}
    assert pid_of(scope, session_id="run-1") == pid_of(scope, routing_key="run-1") == a
    assert pid_of({"job_id": "run-1", **scope}) == a
    assert pid_of({"program_id": "run-1"}) == "run-1"  # unscoped: the id as sent, as ever


def test_a_scope_that_is_not_one_is_no_program_not_the_shared_namespace():
    problems = []
    for bad in ("tenant-a", 7, "0" * 23, "G" * 24, ["x"]):
        meta = parse_program_meta({"program_id": "run-1", SCOPE_KEY: bad}, report=lambda p, w: problems.append(w))
        assert meta is NO_PROGRAM
    assert len(problems) == 5


# -- the HTTP process: the scope a request carries is the one derived here --------------------------


def tokenizer_manager(policy="continuum"):
    return SimpleNamespace(server_args=SimpleNamespace(schedule_policy=policy))


def http(**headers):
    return SimpleNamespace(headers=headers)  # names as Starlette looks them up: lower case


def test_a_client_cannot_send_itself_a_scope(monkeypatch):
    monkeypatch.setattr(plugin, "_scope_header", None)  # no scoping: every client in one namespace
    forged = {"program_id": "run-1", SCOPE_KEY: scope_of("tenant-b")}
    obj = SimpleNamespace(sampling_params={"custom_params": dict(forged)})
    plugin.scope_generate_request(tokenizer_manager(), obj, http())
    assert pid_of(obj.sampling_params["custom_params"]) == "run-1"

    monkeypatch.setattr(plugin, "_scope_header", "x-tenant")
    obj = SimpleNamespace(sampling_params={"custom_params": dict(forged)})
    plugin.scope_generate_request(tokenizer_manager(), obj, request=http(**{"x-tenant": "tenant-a"}))  # gRPC: by name
    assert pid_of(obj.sampling_params["custom_params"]) == scoped("tenant-a", "run-1")
    obj = SimpleNamespace(sampling_params={"custom_params": dict(forged)})
    plugin.scope_generate_request(tokenizer_manager(), obj, None)  # the Python engine: no HTTP request
    assert pid_of(obj.sampling_params["custom_params"]) == "run-1"


def test_every_request_of_a_batch_and_every_id_source_is_scoped(monkeypatch):
    monkeypatch.setattr(plugin, "_scope_header", "authorization")
    shared = {"custom_params": {"program_id": "run-1"}}
    obj = SimpleNamespace(sampling_params=[shared, shared, {}])
    plugin.scope_generate_request(tokenizer_manager(), obj, http(authorization="Bearer a"))
    assert [pid_of(p.get("custom_params")) for p in obj.sampling_params[:2]] == [scoped("Bearer a", "run-1")] * 2
    assert pid_of(obj.sampling_params[2]["custom_params"], session_id="run-1") == scoped("Bearer a", "run-1")
    obj = SimpleNamespace(sampling_params=None)  # a session id or routing key alone names the program
    plugin.scope_generate_request(tokenizer_manager(), obj, http(authorization="Bearer a"))
    assert pid_of(obj.sampling_params["custom_params"], routing_key="run-1") == scoped("Bearer a", "run-1")
    other = SimpleNamespace(sampling_params=None)
    plugin.scope_generate_request(tokenizer_manager("fcfs"), other, http(authorization="Bearer a"))
    assert other.sampling_params is None  # another policy: SGLang as it was


class Scheduler(SimpleNamespace):
    pass


def close_from(tenant, session_id, scheduler):
    """``/close_session`` as SGLang carries it: HTTP process, then the scheduler's handler."""
    obj = SimpleNamespace(session_id=session_id)
    plugin.scope_close_session(tokenizer_manager(), obj, http(**({"x-tenant": tenant} if tenant else {})))
    seen = []
    plugin._around_close_session(lambda s, r: seen.append(r.session_id), scheduler, obj)
    return seen


def test_close_session_ends_only_the_senders_own_program(monkeypatch):
    monkeypatch.setattr(plugin, "_scope_header", "x-tenant")
    ended = []
    scheduler = Scheduler(
        schedule_policy="continuum",
        tree_cache=SimpleNamespace(controller=object(), end_program=ended.append),
        enable_session_radix_cache=False,
        session_controller={"run-1"},
    )
    victim = scoped("tenant-a", "run-1")
    assert close_from("tenant-b", "run-1", scheduler) == ["run-1"]  # SGLang closes its own session id
    assert ended == [scoped("tenant-b", "run-1")] and victim not in ended
    for attack in (victim, f"{RESERVED_PREFIX}close-{scope_of('tenant-a')}:run-1", inferred_id()):
        ended.clear()
        close_from(None, attack, scheduler)
        close_from("tenant-b", attack, scheduler)
        assert ended == []  # not by its scoped id, a forged envelope, nor an inferred id
    close_from("tenant-a", "run-1", scheduler)
    assert ended == [victim]
    ended.clear()
    monkeypatch.setattr(plugin, "_scope_header", None)
    assert close_from("tenant-a", "run-1", scheduler) == ["run-1"] and ended == ["run-1"]  # unscoped: as ever


# -- SGLang's queue limit and the door ---------------------------------------------------------------


def waiting(pid, *, held, first=True):
    req = SimpleNamespace()
    set_tag(req, TurnTag(ProgramMeta(pid), request_rank=0, program_rank=0, held_back=held, new_program=first))
    return req


def arriving(pid):
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params={"program_id": pid}), session_id=None)


def queue_limited(queue, limit=4):
    programs = {"admitted": SimpleNamespace(turns_admitted=1, turns_finished=1)}
    return Scheduler(
        schedule_policy="continuum",
        max_queued_requests=limit,
        waiting_queue=queue,
        tree_cache=SimpleNamespace(controller=SimpleNamespace(programs=programs), report_malformed=MalformedReporter()),
    )


def sglang_refuses(scheduler, req):
    return len(scheduler.waiting_queue) + 1 > scheduler.max_queued_requests  # SGLang's own rule


def test_first_turns_held_at_the_door_never_make_sglang_refuse_an_admitted_programs_return():
    scheduler = queue_limited([waiting(f"new-{i}", held=True) for i in range(4)])
    assert plugin._around_queued_limit(sglang_refuses, scheduler, arriving("admitted")) is False
    assert plugin._around_queued_limit(sglang_refuses, scheduler, arriving("another-new")) is True
    assert plugin._around_queued_limit(sglang_refuses, scheduler, arriving("no-such")) is True
    # a retracted return is re-queued with its tag
    retracted = waiting("admitted", held=False, first=False)
    assert plugin._around_queued_limit(sglang_refuses, scheduler, retracted) is False


def test_the_limit_still_bounds_everything_else():
    full = [waiting(f"r-{i}", held=False, first=False) for i in range(2)] + [waiting("w", held=False)] * 2
    assert plugin._around_queued_limit(sglang_refuses, queue_limited(full), arriving("admitted")) is True
    held_and_returns = [waiting("h", held=True)] * 4 + [waiting(f"r-{i}", held=False, first=False) for i in range(4)]
    # past twice the limit nothing more is taken: the held first turns plus a full queue of others
    assert plugin._around_queued_limit(sglang_refuses, queue_limited(held_and_returns), arriving("admitted")) is True
    assert plugin._around_queued_limit(sglang_refuses, queue_limited([], limit=4), arriving("x")) is False
