"""The door-price experiments of the CPU grid (``continuum_lab.bench.variants``): a rebuild priced
without the prefill step's fixed cost, first turns weighed only while growth is reserved, and the
step's fixed cost priced in the batch place instead of the rebuild."""

from continuum_lab.bench.variants import (
    MarginalRebuild,
    PricedFirstTurns,
    PricedFirstTurnsMarginalRebuild,
    SharedStepCost,
)
from sglang_continuum.core.programs import ProgramState
from sglang_continuum.core.residency import Residency
from sglang_continuum.core.tool_stats import ToolStats


def rebuild_s(tokens: int) -> float:
    return 0.04 + 1e-5 * tokens  # a step's fixed 40 ms, then linear


def test_a_marginal_rebuild_leaves_out_the_steps_fixed_cost():
    full = Residency(True, ToolStats(), rebuild_s)
    marginal = MarginalRebuild(True, ToolStats(), rebuild_s)
    assert full.rebuild_s(1000) == rebuild_s(1000)
    assert marginal.rebuild_s(0) == 0.0
    assert abs(marginal.rebuild_s(1000) - 0.01) < 1e-12
    assert MarginalRebuild(True, ToolStats(), None).rebuild_s is None  # keeping never pays, as before


def test_the_priced_door_weighs_first_turns_only_while_growth_is_reserved():
    for cls in (PricedFirstTurns, PricedFirstTurnsMarginalRebuild):
        r = cls(True, ToolStats(), rebuild_s)
        r.working_set.reserve_growth = False
        assert not r.holds_first_turns()  # the product's door, device-only, weighs them whatever the price
        r.working_set.reserve_growth = True
        assert r.holds_first_turns()
    stock = Residency(True, ToolStats(), rebuild_s)
    stock.working_set.reserve_growth = False
    assert stock.holds_first_turns()


def step_bound_engine(residency: Residency) -> None:
    """Feed ``residency``'s engine a minute of a CPU-like server: each turn one prefill step (a fixed
    40 ms and 1e-5 s a token) and two 20 ms decode steps."""
    now = 0.0
    residency.engine.step(now, None)
    for i in range(400):
        tokens = 200 + 37 * (i % 50)
        now += rebuild_s(tokens)
        residency.engine.step(now, False, (tokens, tokens * tokens))
        for _ in range(2):
            now += 0.02
            residency.engine.step(now, True)


def test_the_shared_step_cost_prices_a_batch_place_at_the_decode_steps_and_each_prefills_fixed_cost():
    stock, shared = Residency(True, ToolStats(), rebuild_s), SharedStepCost(True, ToolStats(), rebuild_s)
    for r in (stock, shared):
        step_bound_engine(r)
    engine = shared.engine
    fixed = engine.prefill.coefficients()[0]
    assert abs(fixed - 0.04) < 1e-3  # the engine's own fit finds the step's fixed cost
    expected = (engine.decode_s + fixed * engine.prefill.steps) / engine.busy_s
    assert abs(engine.decode_share - expected) < 1e-9
    assert engine.decode_share > stock.engine.decode_share + 0.3
    # 2,000 tokens kept 0.3 s, a pool of three: kept by the stock price, let go by this one (the
    # rebuild's 20 ms of tokens is less than the fixed 40 ms it was charged, and the place it holds
    # costs the fixed part of every prefill step besides the decode steps)
    stock.capacity_tokens = shared.capacity_tokens = 6000
    for r in (stock, shared):  # a program of 2,000 tokens ended: the expected final context
        r.working_set.forgotten(ProgramState("p", 0, 0.0, turns_finished=2, context_tokens=2000))
        assert r.working_set.expected_final_context == 2000
    assert stock.keeping_pays(2000, 0.3)
    assert not shared.keeping_pays(2000, 0.3)
