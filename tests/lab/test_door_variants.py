"""A door experiment written as a ``Rules`` variant (``continuum_lab.bench.door_variants``): it runs
in the product's controller unchanged, through the ``door`` slot alone."""

import math

import numpy as np

from continuum_lab.bench.door_variants import PER_TOOL_WINDOW, likely_back_s
from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.door import HOST_TIER_WORKING_SET_WINDOW_S
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.offload import ReloadCost
from sglang_continuum.core.rules import DEFAULT
from sglang_continuum.core.settings import ContinuumSettings


def test_likely_back_is_the_first_elapsed_time_a_return_within_the_horizon_is_no_longer_likely():
    assert likely_back_s(np.array([]), 120.0) == math.inf
    assert likely_back_s(np.full(200, 5.0), 120.0) == 5.0  # every call back at 5 s: after 5 s, not back soon
    assert likely_back_s(np.full(200, 60.0), 120.0) == 60.0
    assert likely_back_s(np.array([1.0] * 50 + [1000.0] * 150), 120.0) == 0.0  # mostly gone for long


def working_tokens_after(rules, seconds: float) -> int:
    clock = ManualClock()
    c = ContinuumController(ContinuumSettings(), clock=clock, budget_tokens=0, rules=rules)
    c.attach_host_tier(reload=ReloadCost(bytes_per_token=1000, bytes_per_s=1e9), host_budget_tokens=0, hold_cost=0.5)
    for _ in range(200):  # a person's think time: back within 5 s, always
        c.stats.record("think", 5.0)
    meta = ProgramMeta("p", tool_name="think", announces_end=True)  # not presumed ended while away
    c.turn_admitted(c.turn_arrived(meta), 600)
    c.turn_finished(meta, context_tokens=700, handle=None)
    clock.advance(seconds)
    c.step(lambda pid: False)
    c.check_integrity()
    return c.door.working_set.tokens


def test_per_tool_window_lets_a_program_go_once_its_tool_says_it_is_not_back_soon():
    assert working_tokens_after(DEFAULT, 30.0) == 700  # the product keeps its room for the whole window
    assert working_tokens_after(DEFAULT, HOST_TIER_WORKING_SET_WINDOW_S + 1) == 0
    assert working_tokens_after(PER_TOOL_WINDOW, 4.0) == 700
    assert working_tokens_after(PER_TOOL_WINDOW, 6.0) == 0  # past the 5 s its tool takes
