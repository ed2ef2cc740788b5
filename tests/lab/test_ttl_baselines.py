"""The paper's baseline TTL models (``continuum_lab.bench.ttl_baselines``), alone and run by the
product's controller as the lab's variants run them."""

import math

import pytest

from continuum_lab.bench.ttl_baselines import BernsteinTTL, ReferenceTTL
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.ttl import TTLQuery
from tests.support import controller

MODELS = {"reference": ReferenceTTL, "bernstein": BernsteinTTL}


def make(ttl_model, budget=10_000, **kw):
    return controller(MODELS[ttl_model], budget=budget, **kw)


def turn(pid, last=False, tool=None):
    return ProgramMeta(pid, last, tool)


def test_reference_rule():
    c, clock = make(ttl_model="reference")
    for i, gap in enumerate([1.0, 3.0, 4.0]):
        c.turn_arrived(turn("p"))
        c.turn_finished(turn("p", tool="slow"), context_tokens=10, handle=f"h{i}")
        clock.advance(gap)
    # unseen tool: pinned 2 s; then the mean of {1} <= 2 pins, the mean of {1, 3} = 2 pins,
    # the mean of {1, 3, 4} > 2 does not.
    c.turn_arrived(turn("p"))
    assert c.turn_finished(turn("p", tool="slow"), context_tokens=10, handle="h").pin is None


def test_T_counts_a_turn_whose_pin_was_shed_while_it_waited():
    c, clock = make(ttl_model="bernstein")  # pins bernstein_t_default_s with no samples; learns T
    c.turn_admitted(c.turn_arrived(turn("p")), 500)
    assert c.turn_finished(turn("p"), context_tokens=600, handle="h").pin is not None
    back = c.turn_arrived(turn("p"))
    assert not back.returning_miss  # its pin held its prefix when it arrived
    assert c.shed("alloc") is not None  # then the pin went while the turn waited
    assert c.sheds.alloc == 1 and c.sheds.while_waiting == 1 and c.sheds.returned == 1
    clock.advance(3.0)
    c.turn_admitted(back, 600)
    assert c.ttl_model.queue_delay.mean == pytest.approx(3.0)  # a miss all the same
    assert c.ttl_model.pin_survival == pytest.approx(1 / 2)  # 0 hits, 1 shed of a program that came back


def test_bernstein_bound_and_fallbacks():
    stats = ToolStats()
    b = BernsteinTTL(ContinuumSettings(), stats, min_samples=5, t_default_s=2.0)
    assert b.ttl(TTLQuery("x", 1)) == 2.0  # no data: T_default
    for _ in range(20):
        stats.record("x", 1.0)
    w = stats.tool("x")
    log_term = math.log(3 / b.delta)
    assert b.bound(w) == pytest.approx(1.0 + 3 * 1.0 * log_term / 20)
    assert b.ttl(TTLQuery("x", 1)) == pytest.approx(4.0 / b.bound(w))
    for _ in range(10):
        b.observe_program_end(10)
    assert b.ttl(TTLQuery("x", 1)) == pytest.approx(4.0 / b.bound(w) * (1 + 0.1 * 10))
