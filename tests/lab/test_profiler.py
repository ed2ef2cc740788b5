"""``continuum-profile``'s fit of a prefill profile."""

import pytest


def test_prefill_profile_fit_recovers_a_quadratic():
    pts = [(n, 0.01 + 2e-4 * n + 3e-8 * n * n) for n in (1000, 2000, 4000, 8000, 16000)]
    from continuum_lab.cli.profiler import fit_profile

    p = fit_profile(pts)
    assert p.seconds(6000) == pytest.approx(0.01 + 2e-4 * 6000 + 3e-8 * 36e6, rel=1e-3)
