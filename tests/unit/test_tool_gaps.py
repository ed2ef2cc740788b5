"""Tokencake's mechanisms in the controller (pure logic, manual clock): client hints, the forecast
they move, predictive upload's pricing and accounting, lending a tool call's gap, and the critical
paths' reserve."""

import numpy as np
import pytest

from sglang_continuum.core.cost_model import CostModelTTL
from sglang_continuum.core.metadata import ProgramMeta, parse_program_meta
from sglang_continuum.core.offload import ReloadCost, lends_gap
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.ttl import TTLQuery
from tests.support import controller

RELOAD = ReloadCost(bytes_per_token=1000, bytes_per_s=1e6, latency_s=0.0)  # 1 ms per token


def test_hints_are_read_and_a_malformed_one_is_ignored_alone():
    problems = []
    meta = parse_program_meta(
        {"program_id": "p", "tool_time_s": "2.5", "app_id": "app-1", "critical": True},
        report=lambda pid, why: problems.append(why),
    )
    assert (meta.tool_time_s, meta.app_id, meta.critical) == (2.5, "app-1", True) and not problems
    for bad in ({"tool_time_s": float("nan")}, {"tool_time_s": 0}, {"tool_time_s": 1e9}, {"tool_time_s": True}):
        meta = parse_program_meta({"program_id": "p", "critical": "yes", **bad}, report=lambda p, w: problems.append(w))
        assert meta.program_id == "p" and meta.tool_time_s is None and meta.critical
    meta = parse_program_meta({"program_id": "p", "app_id": "continuum:x"}, report=lambda p, w: problems.append(w))
    assert meta.app_id is None and any("app_id" in w for w in problems)


def test_a_hint_moves_the_learned_durations_and_stands_alone_without_them():
    stats = ToolStats()
    model = CostModelTTL(ContinuumSettings(), stats)
    assert model.forecast.durations("t", None) is None
    assert model.forecast.durations("t", 4.0).tolist() == [4.0]  # nothing learned: the hint is all there is
    for x in (1.0, 2.0, 3.0) * 4:
        stats.record("t", x)
    moved = model.forecast.durations("t", 6.0)  # blended mean (6 + 2) / 2 = 4: scaled by 2, spread kept
    assert moved.mean() == pytest.approx(4.0) and moved.min() == pytest.approx(2.0)
    assert model.forecast.durations("t", None).tolist() == sorted([1.0, 2.0, 3.0] * 4)
    assert model.forecast.remaining("t", 6.0, elapsed_s=100.0).tolist() == [0.0]  # overdue: any moment


def test_a_hint_changes_the_ttl_only_when_sent():
    stats = ToolStats()
    model = CostModelTTL(ContinuumSettings(max_ttl_s=30.0), stats)
    plain = model.ttl(TTLQuery("t", 1000))
    assert model.last.source == "cold"
    assert model.ttl(TTLQuery("t", 1000, hint_s=25.0)) == 0.0  # a long call: a pin cannot pay
    assert model.last.source == "hint"
    short = model.ttl(TTLQuery("t", 1000, hint_s=0.01))
    assert short == pytest.approx(0.01) and model.ttl(TTLQuery("t", 1000)) == plain
    assert model.signals()["decisions"]["hinted"] == 2


def test_algorithm_1_lends_a_gap_only_when_the_trip_and_the_prefill_fit():
    assert lends_gap(10.0, 1000, request_prefill_s=5.0, reload=RELOAD)  # 10 - 2 * 1 s leaves 8 s
    assert not lends_gap(10.0, 1000, request_prefill_s=9.0, reload=RELOAD)
    assert not lends_gap(1.5, 1000, request_prefill_s=0.0, reload=RELOAD)  # the trip alone outlasts the call
    assert not lends_gap(None, 1000, request_prefill_s=0.0, reload=RELOAD)


def host_controller(**kw):
    c, clock = controller(fixed_ttl_s=1.0, host_ttl_s=60.0, **{"predictive_upload": True, **kw})
    c.attach_host_tier(reload=RELOAD, host_budget_tokens=10_000, hold_cost=0.5)
    return c, clock


def out_on_a_tool(c, clock, pid, hint=None, tokens=100):
    c.turn_arrived(ProgramMeta(pid))
    meta = ProgramMeta(pid, tool_time_s=hint)
    c.turn_finished(meta, context_tokens=tokens, tool="t", handle=f"lock-{pid}")
    clock.advance(1.5)
    for pin in c.step(lambda _: False).expired:
        c.offload(pin).pin.handle = f"host-{pin.program_id}"


def test_an_upload_is_due_the_loads_time_before_a_certain_return_while_turns_wait():
    c, clock = host_controller()
    out_on_a_tool(c, clock, "p", hint=5.0)  # the load of 100 tokens takes 0.1 s
    assert c.uploads.due(clock(), 10_000, contended=True) == []
    clock.advance(5.0 - 1.5 - 0.1 - 0.01)
    assert c.uploads.due(clock(), 10_000, contended=True) == []
    clock.advance(0.02)
    [up] = c.uploads.due(clock(), 10_000, contended=True)
    assert up.deadline > 5.0 - 1.5  # past the predicted return
    released = c.uploads.uploaded(up, "device-lock", clock())
    assert [p.handle for p in released] == ["host-p"] and c.pins.get("p").handle == "device-lock"
    tag = c.turn_arrived(ProgramMeta("p", True))
    assert c.turn_admitted(tag, 120).handle == "device-lock"  # a hit on the uploaded prefix
    c.uploads.due(clock(), 0, contended=False)
    assert (c.uploads.counters.started, c.uploads.counters.used, c.uploads.counters.wasted) == (1, 1, 0)
    c.check_integrity()


def test_no_upload_without_room_a_forecast_or_the_setting():
    c, clock = host_controller()
    out_on_a_tool(c, clock, "p", hint=5.0)
    assert c.uploads.due(clock(), 50, contended=False) == []  # 100 tokens do not fit in 50
    [up] = c.uploads.due(clock() + 0.1, 1_000, contended=False)  # no turn waits: holding is free
    c2, clock2 = host_controller()
    out_on_a_tool(c2, clock2, "q")  # no hint, nothing learned: SGLang's reactive load-back
    assert c2.uploads.due(clock2() + 1.0, 10_000, contended=False) == []
    c3, clock3 = host_controller(predictive_upload=False)
    out_on_a_tool(c3, clock3, "r", hint=5.0)
    assert c3.uploads.due(clock3() + 3.4, 10_000, contended=True) == []


def test_an_upload_released_before_its_return_is_wasted():
    c, clock = host_controller()
    out_on_a_tool(c, clock, "p", hint=5.0)
    [up] = c.uploads.due(clock(), 1_000, contended=False)
    c.uploads.uploaded(up, "device-lock", clock())
    assert [p.handle for p in c.end_program("p")] == ["device-lock"]
    c.uploads.due(clock(), 0, contended=False)
    assert (c.uploads.counters.used, c.uploads.counters.wasted) == (0, 1)
    c.check_integrity()


def test_a_long_tool_call_lends_its_pin_and_a_short_one_does_not():
    c, clock = host_controller()
    for pid, hint in (("long", 30.0), ("short", 0.15)):  # the trip to host and back: 0.2 s
        c.turn_arrived(ProgramMeta(pid))
        c.turn_finished(ProgramMeta(pid, tool_time_s=hint), context_tokens=100, tool="t", handle=f"lock-{pid}")
    spared = c.uploads.gap_spare(request_tokens=200, now=clock())
    assert not spared("long") and spared("short")
    pin = c.shed("gap", spares=(spared,))
    assert pin.program_id == "long" and c.sheds.gap == 1 and "short" in c.pins
    c.check_integrity()


def test_the_critical_reserve_grows_with_pressure_and_is_withheld_from_the_rest():
    c, clock = controller(fixed_ttl_s=1.0)
    crit = c.critical
    assert crit.withheld(None) == 0
    for pid, critical in (("a", True), ("b", False)):
        tag = c.turn_arrived(ProgramMeta(pid, app_id="app", critical=critical))
        c.turn_admitted(tag, 900)
    assert len(crit) == 1 and c.programs.get("a").app_id == "app"
    for _ in range(5):  # the working set (1,800) fills the capacity (1,900): the reserve grows
        clock.advance(1.0)
        c.step(lambda _: False, capacity_tokens=1_900)
    assert crit.ratio == pytest.approx(0.1) and crit.reserve_tokens == 190
    assert crit.withheld(c.programs.get("a")) == 0 and crit.withheld(c.programs.get("b")) == 0  # a uses more
    crit.critical_tokens = 50
    assert crit.withheld(c.programs.get("b")) == 140
    c.end_program("a")
    clock.advance(1.0)
    c.step(lambda _: False, capacity_tokens=1_900)
    assert crit.reserve_tokens == 0 and len(crit) == 0  # no critical program: nothing withheld
    c.check_integrity()


def test_shedding_for_a_non_critical_turn_spares_critical_pins_first():
    c, clock = controller(fixed_ttl_s=10.0)
    for pid, critical in (("crit", True), ("plain", False), ("late", False)):
        tag = c.turn_arrived(ProgramMeta(pid, app_id="app", critical=critical))
        c.turn_admitted(tag, 300)
        c.turn_finished(ProgramMeta(pid), context_tokens=300, tool="t", handle=f"lock-{pid}")
    c.critical.reserve_tokens = 1_000
    order = [c.shed("idle", keep="late").program_id, c.shed("idle", keep="late").program_id]
    assert order == ["plain", "crit"]  # the critical pin went last
    assert np.isclose(c.critical.ratio, 0.0)


def test_the_client_helpers_send_the_hints_the_server_reads():
    from sglang_continuum.client import continuum_extra_body

    body = continuum_extra_body("run-1", tool_name="bash", tool_time_s=2, app_id="app", critical=True, ignore_eos=True)
    assert body["ignore_eos"] is True and "tool_time_s" not in body
    meta = parse_program_meta(body["custom_params"])
    assert (meta.program_id, meta.tool_name, meta.tool_time_s, meta.app_id, meta.critical) == (
        "run-1", "bash", 2.0, "app", True
    )  # fmt: skip


def test_an_applications_later_agent_takes_its_applications_place_in_the_queue():
    """Application-level FCFS: app A's second agent starts after app B's first agent arrived; it
    ranks with A (ahead of B), where program-level FCFS alone put it behind. Without an app id a
    program keeps its own arrival."""
    c, clock = controller(fixed_ttl_s=1.0)
    a1 = c.turn_arrived(ProgramMeta("a1", app_id="A"))
    b1 = c.turn_arrived(ProgramMeta("b1", app_id="B"))
    clock.advance(5.0)
    a2 = c.turn_arrived(ProgramMeta("a2", app_id="A"))
    loner = c.turn_arrived(ProgramMeta("loner"))
    assert a2.program_rank == a1.program_rank < b1.program_rank < loner.program_rank
    assert a2.request_rank > b1.request_rank  # the request's own arrival is kept for ties
    keys = {t.meta.program_id: c.priority_key(t, retracted=False) for t in (a2, b1, loner)}
    assert sorted(keys, key=keys.get) == ["a2", "b1", "loner"]
    clock.advance(c.applications.idle_s + 1)  # an application unseen that long starts again
    a3 = c.turn_arrived(ProgramMeta("a3", app_id="A"))
    assert a3.program_rank == a3.request_rank > loner.program_rank
    c.check_integrity()


def test_an_application_id_is_scoped_like_a_program_id():
    from sglang_continuum.core.metadata import SCOPE_KEY, scope_of

    a, b = ({"program_id": "run-1", "app_id": "app", SCOPE_KEY: scope_of(t)} for t in ("tenant-a", "tenant-b"))
    ids = {parse_program_meta(p).app_id for p in (a, b)}
    assert len(ids) == 2 and "app" not in ids
    assert parse_program_meta({"program_id": "run-1", "app_id": "app"}).app_id == "app"


def test_the_application_table_is_bounded():
    from sglang_continuum.core.applications import ApplicationRanks

    apps = ApplicationRanks(max_applications=3)
    for i in range(10):
        assert apps.rank(f"app-{i}", i, float(i)) == i
    assert len(apps) == 3 and apps.rank("app-9", 99, 10.0) == 9 and apps.rank("app-0", 100, 10.0) == 100
    assert apps.rank(None, 7, 10.0) == 7
    apps.check_integrity()


def test_a_one_step_handoff_pin_is_made_only_where_it_fits_and_never_sheds_another_programs_pin():
    """The handoff pin is for the upload's host copy, not a keeping: a full budget gets no handoff
    pin rather than losing a later program's real pin to it (it was shed for "budget")."""
    from sglang_continuum.core.pins import Pin

    c, clock = controller(fixed_ttl_s=0.0, host_ttl_s=60.0, predictive_upload=True, budget=300)
    c.attach_host_tier(reload=RELOAD, host_budget_tokens=10_000, hold_cost=0.5)
    c.turn_arrived(ProgramMeta("p"))
    c.turn_arrived(ProgramMeta("q"))
    c.turn_finished(ProgramMeta("q"), context_tokens=40, tool="t", handle="lock-q")
    q = c.programs.get("q")
    # a pin of q made outside a turn's end (as an upload's is), of a later program than p
    stored, _ = c.pinning.adopt(Pin("q", 250, clock() + 30.0, q.arrival_rank, clock(), handle="lock-q"), q)
    assert stored
    out = c.turn_finished(ProgramMeta("p", tool_time_s=5.0), context_tokens=100, tool="t", handle="lock")
    assert out.pin is None and out.release == []  # no room: no handoff, and q keeps its pin
    assert c.pins.get("q") is not None and c.pinning.sheds.budget == 0
    c.turn_arrived(ProgramMeta("p"))
    out = c.turn_finished(ProgramMeta("p", tool_time_s=5.0), context_tokens=50, tool="t", handle="lock")
    assert out.pin is not None and out.release == []  # it fits: the one-step pin is made
    c.check_integrity()


def test_a_turn_the_ttl_lets_go_goes_to_host_for_an_upload_when_its_client_forecast_its_call():
    """With HiCache the TTL model lets most prefixes go (a load is cheap), so no device pin ends
    in a host pin and an upload had nothing to load back. With predictive upload and a hint, the
    let-go turn is pinned for one step: its expiry makes the protected host copy, and the upload
    comes the load's time before the forecast return. Without the hint, or the setting: no pin."""
    for upload, hint, hands_off in ((True, 5.0, True), (True, None, False), (False, 5.0, False)):
        c, clock = controller(fixed_ttl_s=0.0, host_ttl_s=60.0, predictive_upload=upload)
        c.attach_host_tier(reload=RELOAD, host_budget_tokens=10_000, hold_cost=0.5)
        c.turn_arrived(ProgramMeta("p"))
        out = c.turn_finished(ProgramMeta("p", tool_time_s=hint), context_tokens=100, tool="t", handle="lock")
        assert out.ttl == 0 and (out.pin is not None) == hands_off
        clock.advance(0.01)
        expired = c.step(lambda _: False).expired
        assert [p.program_id for p in expired] == (["p"] if hands_off else [])
        if hands_off:
            c.offload(expired[0]).pin.handle = "host-p"
            clock.advance(5.0 - 0.01 - 0.1 + 0.01)
            [up] = c.uploads.due(clock(), 10_000, contended=True)
            assert up.host.handle == "host-p"
        c.check_integrity()
