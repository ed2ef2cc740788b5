"""The overtaking budget follows the return loss: full while the pool keeps locality, down to
``MIN_OVERTAKES`` as it thrashes, fixed per request when it enters the queue."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.bounded_waiting import MIN_OVERTAKES, THRASH_LOSS, BoundedWaiting
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.return_loss import ReturnLossMeter
from tests.support import controller


def waiting(loss: float, samples: int = 32, max_overtakes: int = 32) -> BoundedWaiting:
    meter = ReturnLossMeter(window=32)
    for _ in range(samples):
        meter.observe(1000, round(1000 * (1.0 - loss)))
    return BoundedWaiting(max_overtakes, meter)


def test_budget_is_full_while_the_pool_keeps_locality():
    assert waiting(0.0).budget() == 32
    assert waiting(THRASH_LOSS).budget() == 32
    assert waiting(1.0, samples=7).budget() == 32  # too few returns to tell: no judgement yet


def test_budget_falls_linearly_with_the_return_loss_past_thrash():
    assert waiting(0.75).budget() == 17  # halfway from 0.5 to 1: halfway from 32 to 2
    assert waiting(1.0).budget() == MIN_OVERTAKES == 2
    assert waiting(1.0, max_overtakes=1).budget() == 1  # the floor is capped at the ceiling
    assert waiting(1.0, max_overtakes=0).budget() == 0  # no bound at all


def test_a_floor_of_zero_is_refused():
    # budget 0 means "no bound" (overdue_after), so a floor of 0 would unbound exactly the turns of a
    # thrashing pool
    with pytest.raises(ValueError, match="min_overtakes"):
        BoundedWaiting(32, ReturnLossMeter(), min_overtakes=0)


@given(
    losses=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=64),
    k_max=st.integers(0, 64),
    k_min=st.integers(1, 64),
)
def test_budget_stays_between_floor_and_ceiling(losses, k_max, k_min):
    meter = ReturnLossMeter(window=32)
    bounded = BoundedWaiting(k_max, meter, min_overtakes=k_min)
    for loss in losses:
        meter.observe(1000, round(1000 * (1.0 - loss)))
        budget = bounded.budget()
        if k_max == 0:
            assert budget == 0
        else:
            assert 1 <= min(k_min, k_max) <= budget <= k_max  # never 0, which means no bound
            assert budget == k_max or meter.ratio > THRASH_LOSS


def thrash(c: ContinuumController, programs: int = 8) -> None:
    """Programs come back and find none of their contexts (the starvation probe's pool)."""
    for i in range(programs):
        pid = f"t{i}"
        c.turn_admitted(c.turn_arrived(ProgramMeta(pid, False, None)), 500)
        c.turn_finished(ProgramMeta(pid, False, None), context_tokens=500, handle=None)
        c.turn_admitted(c.turn_arrived(ProgramMeta(pid, False, None)), 600, cached_tokens=0)


def test_a_late_request_is_overdue_sooner_once_the_pool_thrashes():
    c, _ = controller()
    floor = MIN_OVERTAKES
    late = ProgramMeta("late", False, None)
    c.turn_admitted(c.turn_arrived(late), 500)
    c.turn_finished(late, context_tokens=500, handle=None)  # out on a tool
    before = c.turn_arrived(ProgramMeta("before", False, None))
    assert before.overtake_budget == 32
    thrash(c)
    assert c.admission_control.return_loss.ratio == 1.0 and c.bounded.budget() == floor
    again = c.turn_arrived(late)  # the late program's next turn, while the pool thrashes
    assert again.turn == 2 and again.overtake_budget == floor
    new = c.turn_arrived(ProgramMeta("new", False, None))
    assert new.overtake_budget == 32  # a first turn keeps the full budget: the door is load control
    for i in range(floor):  # later arrivals of an average admission's prefill work each
        assert not c.is_overdue(again)
        c.turn_admitted(c.turn_arrived(ProgramMeta(f"o{i}", False, None)), math.ceil(c.bounded.mean_work))
    assert c.is_overdue(again) and not c.is_overdue(new)
    # the request that entered while the pool kept locality keeps its budget (its key changes only
    # at events the incremental order knows): 16 + floor later arrivals overtook it so far
    assert before.overtake_budget == 32 and not c.is_overdue(before)
    c.turn_admitted(again, 510, cached_tokens=0)
    assert c.last_admission.overtaken == pytest.approx(floor, abs=0.01) and c.last_admission.overtake_budget == floor
    c.check_integrity()
