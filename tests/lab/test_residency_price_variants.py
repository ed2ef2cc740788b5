"""The door-price experiments of the CPU grid (``continuum_lab.bench.variants``): a rebuild priced
without the prefill step's fixed cost, and first turns weighed only while growth is reserved."""

from continuum_lab.bench.variants import MarginalRebuild, PricedFirstTurns, PricedFirstTurnsMarginalRebuild
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
