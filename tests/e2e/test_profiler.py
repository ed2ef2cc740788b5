"""The profiler against a real server: the points the emulator's step model is fitted on."""

import pytest

from continuum_lab.cli.profiler import measure, measure_decode, measure_extend
from continuum_lab.emulator.step_model import StepLatencyModel, fit_decode, fit_prefill

pytestmark = pytest.mark.e2e


def test_profiler_measures_fresh_prefills_cached_extends_and_decode_steps(continuum_server):
    url = continuum_server.url
    fresh = measure(url, [64, 256, 640], repeats=1, vocab=500)
    extends = measure_extend(url, prefixes=[200, 600], new=[40], vocab=500, repeats=1)  # raises if not cached
    decode = measure_decode(url, batches=[1, 2], contexts=[128, 256], vocab=500, short=2, long=18, repeats=2)
    assert [p[0] for p in fresh] == [64, 256, 640] and all(p[1] > 0 for p in fresh)
    assert [(e, p) for e, p, _ in extends] == [(40, 200), (40, 600)]
    assert [(b, ctx) for b, ctx, _ in decode] == [
        (1, 128 + 10),
        (2, 2 * (128 + 10)),
        (1, 256 + 10),
        (2, 2 * (256 + 10)),
    ]
    assert all(y > 0 for _, _, y in extends)
    # a decode step is the difference of two timed batches: on a loaded machine one point may vanish
    assert all(y >= 0 for _, _, y in decode) and sum(y for _, _, y in decode) > 0
    coeffs, prefix = fit_prefill(fresh, extends)
    model = StepLatencyModel(
        prefill=coeffs, prefix_coeff=prefix, decode=fit_decode(decode)
    )  # leaves a vanished point out
    assert 0 < model.prefill_seconds([(40, 600)]) < 60 and 0 < model.decode_seconds(2, 512) < 60
