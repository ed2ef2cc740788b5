"""The overtaking budget follows the return loss: full while the pool keeps locality, down to
``MIN_OVERTAKES`` as it thrashes, fixed per request when it enters the queue."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.bounded_waiting import MIN_OVERTAKES, THRASH_LOSS, BoundedWaiting
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.metadata import NO_PROGRAM, ProgramMeta
from sglang_continuum.core.return_loss import ReturnLossMeter
from tests.support import controller


def waiting(loss: float, samples: int = 32, max_overtakes: int = 32) -> BoundedWaiting:
    bounded = BoundedWaiting(max_overtakes)
    bounded.return_loss = ReturnLossMeter(window=32)
    for _ in range(samples):
        bounded.observe_return(1000, 1000, round(1000 * (1.0 - loss)))
    return bounded


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
        BoundedWaiting(32, min_overtakes=0)


@given(
    losses=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=64),
    k_max=st.integers(0, 64),
    k_min=st.integers(1, 64),
)
def test_budget_stays_between_floor_and_ceiling(losses, k_max, k_min):
    bounded = BoundedWaiting(k_max, min_overtakes=k_min)
    meter = bounded.return_loss = ReturnLossMeter(window=32)
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
    assert c.bounded.return_loss.ratio == 1.0 and c.bounded.budget() == floor
    again = c.turn_arrived(late)  # the late program's next turn, while the pool thrashes
    assert again.turn == 2 and again.overtake_budget == floor
    new = c.turn_arrived(ProgramMeta("new", False, None))
    assert new.overtake_budget == 32  # a first turn keeps the full budget: the door is load control
    for i in range(floor):  # later arrivals that prefill an average prompt from scratch: one overtake each
        assert not c.is_overdue(again)
        c.turn_admitted(c.turn_arrived(ProgramMeta(f"o{i}", False, None)), math.ceil(c.bounded.mean_prompt))
    assert c.is_overdue(again) and not c.is_overdue(new)
    # the request that entered while the pool kept locality keeps its budget (its key changes only
    # at events the incremental order knows): 16 + floor later arrivals overtook it so far
    assert before.overtake_budget == 32 and not c.is_overdue(before)
    c.turn_admitted(again, 510, cached_tokens=0)
    assert c.last_admission.overtaken == pytest.approx(floor, abs=0.01) and c.last_admission.overtake_budget == floor
    c.check_integrity()


def test_a_first_admission_of_one_token_does_not_make_every_later_one_count_hundreds():
    """A fresh server's first admission is often a 1-token health probe: the mean prompt must not
    start there and crawl up (with every admission counting hundreds of overtakes meanwhile, every
    waiting request is overdue and program order is gone)."""
    bounded = BoundedWaiting(32)
    bounded.admitted(1)
    for _ in range(20):
        bounded.admitted(500)
    steps = []
    for _ in range(10):
        before = bounded.overtake_clock
        bounded.admitted(500)
        steps.append(bounded.overtake_clock - before)
    assert all(0.95 < step < 1.1 for step in steps), steps  # an average prompt from scratch: one overtake
    assert bounded.mean_prompt == pytest.approx(500, rel=0.05)
    bounded.check_integrity()


@given(admissions=st.lists(st.tuples(st.integers(0, 200_000), st.floats(0.0, 1.0)), min_size=1, max_size=600))
def test_the_mean_prompt_stays_within_the_prompts_it_averages(admissions):
    bounded = BoundedWaiting(32)
    for prompt, cached_share in admissions:
        before = bounded.overtake_clock
        bounded.admitted(prompt, int(prompt * cached_share))
        assert bounded.overtake_clock > before  # every admission moves the clock, a full hit a little
        bounded.check_integrity()
    prompts = [max(1, p) for p, _ in admissions]
    assert min(prompts) - 1e-6 <= bounded.mean_prompt <= max(prompts) + 1e-6


def test_a_health_probe_does_not_move_the_overtaking_clock():
    """An idle server answers SGLang's health probe every few seconds: 1-token admissions that
    are nobody's traffic must not drag the mean work per admission down (after an idle hour,
    every admission of the next burst would count as hundreds of overtakes)."""
    c, _ = controller()
    for i in range(8):
        c.turn_admitted(c.turn_arrived(ProgramMeta(f"p{i}", False, None)), 500)
    pace, mean = c.bounded.overtake_clock, c.bounded.mean_prompt
    for _ in range(1000):
        c.turn_admitted(c.turn_arrived(NO_PROGRAM), 1, probe=True)
    assert c.bounded.overtake_clock == pace and c.bounded.mean_prompt == mean
    waiting = c.turn_arrived(ProgramMeta("late", False, None))
    c.turn_admitted(c.turn_arrived(ProgramMeta("next", False, None)), 500)
    assert c.bounded.overtaken(waiting) == pytest.approx(1.0, abs=0.05)
