import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_continuum.core.cost_model import (
    CostModelTTL,
    EtaEstimator,
    PrefillProfile,
    SlidingMean,
    exp_optimum,
)
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.tool_stats import SampleWindow, ToolStats
from sglang_continuum.core.ttl import TTLQuery, optimal_ttl


def objective(samples, benefit, tau):
    return np.mean(np.asarray(samples) <= tau) * benefit - tau


def test_hand_computed_cases():
    # samples {1, 2, 10}: tau=1 -> B/3 - 1, tau=2 -> 2B/3 - 2, tau=10 -> B - 10
    assert optimal_ttl([1, 2, 10], 2.0) == 0.0  # every candidate is negative
    assert optimal_ttl([1, 2, 10], 6.0) == 2.0  # 1, 2 vs 1: tau=2 wins (2.0 > 1.0 > -4)
    assert optimal_ttl([1, 2, 10], 30.0) == 10.0  # 20 vs 18 vs 9
    assert optimal_ttl([0.5, 0.5, 0.5, 8.0], 4.0) == 0.5  # duplicates count together: 3 - 0.5
    assert optimal_ttl([], 5.0) == 0.0 and optimal_ttl([1.0], 0.0) == 0.0
    assert optimal_ttl([3.0, 1.0, 2.0], 6.0) == 3.0  # unsorted input is fine: 3 > 2 > 1


@settings(max_examples=300, deadline=None)
@given(
    samples=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=60),
    benefit=st.floats(0, 500, allow_nan=False),
)
def test_result_is_a_candidate_and_beats_zero_and_every_other_candidate(samples, benefit):
    tau = optimal_ttl(samples, benefit)
    assert tau == 0.0 or tau in samples
    best = objective(samples, benefit, tau)
    assert best >= objective(samples, benefit, 0.0) - 1e-9
    assert all(best >= objective(samples, benefit, c) - 1e-9 for c in samples)


def settings_(**kw):
    return ContinuumSettings(**kw)


def model(k=100, coeffs=(0.0, 0.0, 0.0)):
    stats = ToolStats()
    return CostModelTTL(settings_(), stats, PrefillProfile(coeffs), cold_start_k=k), stats


@pytest.mark.parametrize("benefit", [0.5, 1.0, 3.0, 50.0])
def test_cold_start_is_the_exp1_optimum(benefit):
    m, _ = model(coeffs=(benefit, 0.0, 0.0))  # B = PrefillReload = benefit, T = 0
    d = m.decide(TTLQuery("t", 100))
    assert d.source == "cold"
    assert d.ttl == pytest.approx(math.log(benefit) if benefit > 1 else 0.0)
    # ln(B) maximises (1 - e^-tau) B - tau numerically too
    grid = np.linspace(0, 10, 100001)
    assert d.ttl == pytest.approx(grid[np.argmax((1 - np.exp(-grid)) * benefit - grid)], abs=1e-3)


@pytest.mark.parametrize("scale", [0.1, 10.0, 60.0])
def test_cold_start_ttl_does_not_depend_on_the_unit_of_time(scale):
    """Issue 24: the demo's tools take 0.2-0.6 s and a miss costs at most 0.7 s, so the paper's
    Exp(1)-seconds cold start (pin only when B > 1 s) never pinned, although pins with a TTL of
    a fraction of a second would pay. Measured in other units (every time x ``scale``) the same
    workload must get the same decisions, x ``scale``."""

    def decide(unit: float):
        m, stats = model(coeffs=(0.3 * unit, 0.0, 0.0))  # PrefillReload 0.3 s
        for x in (0.05, 0.1, 0.1, 0.2, 0.3, 0.5) * 5:  # 30 samples <= K: cold start
            stats.record("t", x * unit)
        for _ in range(4):
            m.observe_queue_delay(0.2 * unit)  # T = 0.2 s
        return m.decide(TTLQuery("t", 100))

    base, scaled = decide(1.0), decide(scale)
    assert base.source == scaled.source == "cold"
    mean = 1.25 / 6  # of the samples: B = 0.5 s > the mean, so a pin pays under Exp(mean)
    assert base.ttl == pytest.approx(mean * math.log(0.5 / mean), rel=1e-3)
    assert scaled.ttl == pytest.approx(base.ttl * scale, rel=1e-9)


def test_cold_start_without_samples_is_the_papers_exp1():
    m, _ = model(coeffs=(3.0, 0.0, 0.0))
    assert m.decide(TTLQuery("t", 1)).ttl == pytest.approx(math.log(3.0))
    assert exp_optimum(3.0, 1.0) == pytest.approx(math.log(3.0))
    assert exp_optimum(3.0, 0.5, cap_s=0.1) == 0.1
    assert exp_optimum(0.4, 0.5) == 0.0


def test_every_decision_exports_its_inputs(caplog):
    m, stats = model(k=3, coeffs=(0.25, 0.0, 0.0))
    m.observe_queue_delay(0.5)
    with caplog.at_level(logging.DEBUG, logger="sglang_continuum.core.cost_model"):
        assert m.ttl(TTLQuery("grep", 700)) == 0.0  # cold, no samples: B = 0.75 < 1
        for x in (0.1, 0.2, 0.2, 0.3):
            stats.record("grep", x)
        tau = m.ttl(TTLQuery("grep", 700))  # 4 samples > K = 3: the tool's own CDF
    assert tau == pytest.approx(0.3)  # 1 * 0.75 - 0.3 beats 0.75 * 0.75 - 0.2
    d = m.last
    assert (d.source, d.tool, d.context_tokens, d.tool_samples, d.samples) == ("tool", "grep", 700, 4, 4)
    assert (d.queue_delay_s, d.queue_delay_samples, d.eta, d.rebuild_s) == (0.5, 1, 1.0, 0.25)
    assert d.benefit_s == pytest.approx(0.75)
    signals = m.signals()
    assert signals["decisions"] == {
        "cold": 1, "cold_zero": 1, "global_cdf": 0, "global_cdf_zero": 0, "tool_cdf": 1, "tool_cdf_zero": 0,
        "hinted": 0, "hinted_zero": 0
    }  # fmt: skip
    assert signals["last_decision"]["ttl"] == pytest.approx(0.3)
    lines = [r.getMessage() for r in caplog.records if "ttl decision" in r.getMessage()]
    assert len(lines) == 2
    assert "branch=cold" in lines[0] and "T=0.500s (1 misses)" in lines[0] and "reload=0.250s (700 tokens)" in lines[0]
    assert "branch=tool" in lines[1] and "ttl=0.300s" in lines[1] and "tool_samples=4" in lines[1]


def test_chain_switches_at_k_exactly():
    m, stats = model(k=10, coeffs=(5.0, 0.0, 0.0))
    for _ in range(10):
        stats.record("fast", 0.2)
    assert m.decide(TTLQuery("fast", 1)).source == "cold"  # |S| = 10 <= K
    stats.record("other", 9.0)
    d = m.decide(TTLQuery("fast", 1))
    assert d.source == "global" and d.samples == 11  # |S| = 11 > K, |S[fast]| = 10 <= K
    stats.record("fast", 0.2)
    d = m.decide(TTLQuery("fast", 1))
    assert d.source == "tool" and d.ttl == pytest.approx(0.2)  # |S[fast]| = 11 > K
    assert m.decide(TTLQuery("never-seen", 1)).source == "global"


def test_T_moves_when_missed_turns_queue():
    m, stats = model(k=0, coeffs=(0.0, 0.0, 0.0))
    stats.record("t", 1.0)
    assert m.benefit_s(100) == 0.0 and m.ttl(TTLQuery("t", 100)) == 0.0
    for _ in range(5):
        m.observe_queue_delay(4.0)
    assert m.benefit_s(100) == pytest.approx(4.0)  # T * eta with eta = 1 at cold start
    assert m.ttl(TTLQuery("t", 100)) == 1.0


def test_eta_fixed_length_programs_give_one():
    e = EtaEstimator()
    for _ in range(200):
        e.add(11)
    assert e.eta == pytest.approx(1.0)


def test_eta_geometric_lengths_give_about_zero():
    # Memoryless lengths: the remaining turns do not depend on turns served. With 5,000 programs
    # (~20,000 decision points) the sample correlation's standard error is ~0.01; 0.05 is 5 sigma.
    rng = np.random.default_rng(0)
    e = EtaEstimator(window=5000)
    for n in rng.geometric(0.2, size=5000):
        e.add(int(n))
    assert abs(e.eta) < 0.05


def test_eta_matches_numpy_on_random_lengths_and_window_drops_old_programs():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 30, size=300)
    e = EtaEstimator(window=100)
    for n in lengths:
        e.add(int(n))
    ks, rs = [], []
    for n in lengths[-100:]:
        ks += list(range(1, n))
        rs += [n - k for k in range(1, n)]
    assert e.eta == pytest.approx(-np.corrcoef(ks, rs)[0, 1], abs=1e-9)


def test_eta_undefined_is_one():
    e = EtaEstimator()
    assert e.eta == 1.0
    e.add(2)
    e.add(2)
    assert e.eta == 1.0


def test_sliding_mean_and_window():
    s = SlidingMean(3)
    for x in (1, 2, 3, 10):
        s.add(x)
    assert s.mean == pytest.approx(5.0)
    w = SampleWindow(3, [5, 1, 3, 2])
    assert list(w.sorted) == [1, 2, 3] and w.samples() == [1, 3, 2] and w.cdf(2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        w.add(-1)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.5, 7.0]), max_size=20), max_size=6),
)
def test_batch_extend_equals_adding_one_by_one(capacity, batches):
    """Peers' samples are merged a batch at a time; the window must end exactly as if each had
    been added alone (duplicates included: equal old values are deleted one copy each)."""
    batched, single = SampleWindow(capacity), SampleWindow(capacity)
    for batch in batches:
        batched.extend(batch)
        for x in batch:
            single.add(x)
        batched.check_integrity()
        assert batched.samples() == single.samples()
        assert batched.sorted.tolist() == single.sorted.tolist()
        assert batched.mean == pytest.approx(single.mean, nan_ok=True)
        assert batched.variance == pytest.approx(single.variance, abs=1e-9)


def test_settings_load_without_importing_the_models():
    """The settings resolve the rules (and so the models) only when validated, so the settings
    module itself imports no model: no circle settings -> rules -> cost_model -> settings."""
    import subprocess
    import sys

    probe = (
        "import sys; import sglang_continuum.core.settings; "
        "assert not {m for m in sys.modules if m.endswith(('rules', 'cost_model', '.ttl', 'offload'))}, sys.modules; "
        "from sglang_continuum.core.settings import ContinuumSettings; ContinuumSettings()"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)
