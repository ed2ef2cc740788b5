"""The host tier in the cost model and the controller: reload cost, host TTL, host pins (pure
logic, manual clock)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.cost_model import CostModelTTL, PrefillProfile
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.offload import ReloadCost, host_ttl, remaining_samples
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.ttl import TTLQuery
from tests.support import controller

RELOAD = ReloadCost(bytes_per_token=1000, bytes_per_s=1e6, latency_s=0.0)  # 1 ms per token


def test_reload_cost_is_linear_in_tokens():
    assert RELOAD.seconds(500) == pytest.approx(0.5)
    assert ReloadCost(100, 1e9, latency_s=0.002).seconds(0) == 0.002
    with pytest.raises(ValueError):
        ReloadCost(0)


def test_host_ttl_conditions_on_the_tool_not_having_returned():
    s = np.array([1.0, 2.0, 10.0, 11.0])
    assert remaining_samples(s, 1.5).tolist() == [0.5, 8.5, 9.5]
    # at elapsed 1.5 only 2.0 s is still plausibly near; with a big benefit, wait for 11 s
    assert host_ttl(s, 1.5, benefit_s=100.0, hold_cost=1.0) == pytest.approx(9.5)
    # with a benefit that only pays for the short wait: 1/3 * 3 - 0.5 > 0 beats 1 * 3 - 9.5
    assert host_ttl(s, 1.5, benefit_s=3.0, hold_cost=1.0) == pytest.approx(0.5)
    # host memory 10x cheaper than device: the long wait pays again
    assert host_ttl(s, 1.5, benefit_s=3.0, hold_cost=0.1) == pytest.approx(9.5)
    assert host_ttl(s, 20.0, benefit_s=100.0, hold_cost=1.0) == 0.0  # every call returned by now
    assert host_ttl(s, 0.0, benefit_s=0.0, hold_cost=1.0) == 0.0


def test_host_ttl_cold_start_is_memoryless():
    assert host_ttl(None, 5.0, benefit_s=4.0, hold_cost=0.5) == pytest.approx(math.log(8.0))
    assert host_ttl(None, 5.0, benefit_s=0.4, hold_cost=0.5) == 0.0
    # Exp(mean m): m ln(B / (hold m)); the same decision in minutes as in seconds
    assert host_ttl(None, 5.0, benefit_s=0.4, hold_cost=0.5, cold_mean_s=0.1) == pytest.approx(0.1 * math.log(8.0))
    assert host_ttl(None, 300.0, benefit_s=24.0, hold_cost=0.5, cold_mean_s=6.0) == pytest.approx(
        60 * host_ttl(None, 5.0, benefit_s=0.4, hold_cost=0.5, cold_mean_s=0.1)
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40),
    st.floats(0, 50),
    st.floats(0.01, 100),
    st.floats(0.01, 10),
)
def test_host_ttl_is_the_best_candidate(samples, elapsed, benefit, hold):
    s = np.sort(np.array(samples))
    ttl = host_ttl(s, elapsed, benefit, hold)
    rest = remaining_samples(s, elapsed)

    def value(tau):
        return (np.sum(rest <= tau) / rest.size) * benefit - hold * tau if rest.size else 0.0

    assert ttl == 0.0 or ttl in rest.tolist()
    for cand in [0.0, *rest.tolist()]:
        assert value(ttl) >= value(cand) - 1e-9


def cost_model(k=5, **kw):
    stats = ToolStats()
    model = CostModelTTL(ContinuumSettings(**kw), stats, PrefillProfile((0.0, 0.01, 0.0)), cold_start_k=k)
    return stats, model


def test_with_a_host_tier_a_miss_costs_a_reload_not_a_prefill():
    _, model = cost_model()
    assert model.benefit_s(1000) == pytest.approx(10.0)  # prefill: 10 ms per token
    model.use_host_tier(RELOAD, hold_cost=0.5, max_host_ttl_s=300.0)
    assert model.benefit_s(1000) == pytest.approx(1.0)  # reload: 1 ms per token
    # host copy: saves prefill - reload = 9 s; cold start with Exp(1): ln(9 / 0.5)
    assert model.host_ttl(TTLQuery("t", 1000), elapsed_s=3.0) == pytest.approx(math.log(18.0))


def test_device_ttl_shrinks_when_hicache_makes_misses_cheap():
    stats, model = cost_model()
    for x in np.linspace(0.5, 5.0, 50):
        stats.record("t", float(x))
    q = TTLQuery("t", 1000)  # prefill 10 s: pin through the whole tool CDF
    without = model.ttl(q)
    assert without == pytest.approx(5.0)
    model.use_host_tier(RELOAD, hold_cost=0.5, max_host_ttl_s=300.0)
    assert model.ttl(q) < without


def make(**kw):
    c, clock = controller(fixed_ttl_s=1.0, host_ttl_s=30.0, **kw)
    c.attach_host_tier(reload=RELOAD, host_budget_tokens=1_000, hold_cost=0.5)
    return c, clock


def first_turn(c, pid, tokens=100, tool="t"):
    c.turn_arrived(ProgramMeta(pid))
    return c.turn_finished(ProgramMeta(pid), context_tokens=tokens, tool=tool, handle=f"lock-{pid}").pin


def offload_after_expiry(c, clock, pid):
    clock.advance(1.5)
    [pin] = c.step(lambda _: False).expired
    out = c.offload(pin)
    assert out.pin is not None and out.pin.tier == "host"
    out.pin.handle = f"host-{pid}"
    return out.pin


def test_expired_pin_becomes_a_host_pin_released_when_the_next_turn_is_admitted():
    c, clock = make()
    first_turn(c, "p")
    host = offload_after_expiry(c, clock, "p")
    assert host.deadline == pytest.approx(1.5 + 30.0) and c.host.pins.pinned_tokens == 100
    tag = c.turn_arrived(ProgramMeta("p", True))
    assert tag.returning_miss  # no device pin: it is a device miss even if host has it
    assert c.turn_admitted(tag, 100) is None
    assert [p.handle for p in c.host_returned(tag, loaded_tokens=99)] == ["host-p"]
    assert c.host.counters.host_hits == 1 and c.host.counters.host_hit_tokens == 99 and len(c.host.pins) == 0


def test_host_pins_end_on_last_step_abort_idle_and_expiry():
    c, clock = make()
    for pid in "abc":
        first_turn(c, pid)
    clock.advance(1.5)
    for pin in c.step(lambda _: False).expired:
        c.offload(pin).pin.handle = f"host-{pin.program_id}"
    assert len(c.host.pins) == 3
    c.turn_arrived(ProgramMeta("a", True))
    out = c.turn_finished(ProgramMeta("a", True), context_tokens=120, handle=None)
    assert [p.handle for p in out.release] == ["host-a"]
    assert [p.handle for p in c.turn_aborted(ProgramMeta("b"))] == ["host-b"]
    clock.advance(31.0)
    assert [p.handle for p in c.step(lambda _: False).host_expired] == ["host-c"]
    assert len(c.host.pins) == 0 and c.host.counters.host_expired == 1


def test_no_host_pin_for_programs_that_ended_or_without_a_host_tier():
    c, clock = make()
    first_turn(c, "p")
    clock.advance(1.5)
    [pin] = c.step(lambda _: False).expired
    c.programs.forget("p")
    assert c.offload(pin).pin is None
    plain, _ = controller(budget=100)
    plain.turn_arrived(ProgramMeta("q"))
    assert plain.offload(plain.turn_finished(ProgramMeta("q"), context_tokens=10, handle="h").pin).pin is None


def test_shed_while_next_turn_waits_keeps_the_host_copy_until_admission():
    c, clock = make(max_wait_hold_s=5.0)
    pin = first_turn(c, "p")
    c.turn_arrived(ProgramMeta("p", True))  # the next turn is already queued
    assert c.shed("alloc") is pin
    host = c.offload(pin).pin
    assert host is not None and host.deadline == pytest.approx(5.0)


def test_host_budget_sheds_latest_program_first():
    c, clock = make()
    for pid in ("early", "late"):
        first_turn(c, pid, tokens=600)
    clock.advance(1.5)
    pins = sorted(c.step(lambda _: False).expired, key=lambda p: p.arrival_rank)
    early = c.offload(pins[0])
    early.pin.handle = "host-early"
    late = c.offload(pins[1])  # 600 + 600 > 1000: the later program is refused
    assert late.pin is None and [p.program_id for p in c.host.pins] == ["early"]
    c.host.pins.check_integrity()
