"""The emulator's step-latency model: the arithmetic the virtual clock advances by."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_lab.emulator.step_model import StepLatencyModel, fit_decode

MODEL = StepLatencyModel(prefill=(0.01, 1e-4, 1e-8), decode=(0.005, 1e-4, 1e-7), name="t")


def test_single_request_prefill_is_the_familiar_quadratic():
    n = 4000
    assert MODEL.prefill_seconds([(n, 0)]) == pytest.approx(0.01 + 1e-4 * n + 1e-8 * n * n)


def test_new_tokens_on_a_cached_prefix_pay_attention_to_it_but_not_its_linear_cost():
    cold = MODEL.prefill_seconds([(8000, 0)])
    warm = MODEL.prefill_seconds([(500, 7500)])
    assert warm == pytest.approx(0.01 + 1e-4 * 500 + 1e-8 * (500 * 500 + 2 * 500 * 7500))
    assert warm < cold / 4


@given(st.lists(st.tuples(st.integers(1, 10_000), st.integers(0, 50_000)), min_size=1, max_size=8))
def test_a_batch_costs_one_fixed_overhead_plus_each_requests_work(extends):
    c0 = MODEL.prefill[0]
    alone = sum(MODEL.prefill_seconds([x]) - c0 for x in extends)
    assert MODEL.prefill_seconds(extends) == pytest.approx(c0 + alone)


def test_decode_step_grows_with_batch_and_context():
    assert MODEL.decode_seconds(1, 1000) == pytest.approx(0.005 + 1e-4 + 1e-4)
    assert MODEL.decode_seconds(64, 64 * 8000) > MODEL.decode_seconds(64, 64 * 1000) > MODEL.decode_seconds(1, 1000)


def test_fit_decode_recovers_the_coefficients_it_was_made_from():
    d = (0.004, 2e-4, 3e-8)
    points = [(b, b * ctx, d[0] + d[1] * b + d[2] * b * ctx) for b in (1, 8, 32, 128) for ctx in (1000, 8000, 32000)]
    assert fit_decode(points) == pytest.approx(d, rel=1e-6)


def test_fit_decode_leaves_out_a_step_that_vanished_and_refuses_too_few_left():
    """On a loaded machine one timed difference can come out as 0 s (the e2e profiler test's
    ``decode B=2 L=256: 0.00 ms/step``): it says nothing of the step, and the fit stands without it."""
    d = (0.004, 2e-4, 3e-8)
    points = [(b, b * ctx, d[0] + d[1] * b + d[2] * b * ctx) for b in (1, 8, 32) for ctx in (1000, 8000)]
    assert fit_decode([*points, (2, 532, 0.0)]) == pytest.approx(d, rel=1e-6)
    with pytest.raises(ValueError, match="at least 3"):
        fit_decode([*points[:2], (2, 532, 0.0)])


def test_pool_from_memory_facts_is_static_memory_less_weights_over_kv_bytes():
    gpu = StepLatencyModel(
        prefill=(0, 0, 0), decode=(0, 0, 0), kv_bytes_per_token=131072, weights_bytes=16e9, gpu_memory_bytes=80e9
    )
    assert gpu.kv_pool_tokens(0.88) == int((80e9 * 0.88 - 16e9) // 131072)
    with pytest.raises(ValueError, match="memory facts"):
        MODEL.kv_pool_tokens()


def test_a_prefill_only_profile_is_refused_with_the_command_that_fixes_it(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "x", "coeffs": [0.01, 1e-4, 0.0]}))
    with pytest.raises(ValueError, match="continuum-profile --decode"):
        StepLatencyModel.load(path)


def test_negative_coefficients_are_refused():
    with pytest.raises(ValueError):
        StepLatencyModel(prefill=(0.01, -1e-4, 0.0), decode=(0, 0, 0))


def test_every_committed_emulator_profile_loads():
    from pathlib import Path

    profiles = Path(__file__).resolve().parents[2] / "configs" / "profiles"
    loaded = [
        StepLatencyModel.load(p)
        for p in sorted(profiles.glob("*.json"))
        if "coeffs" in json.loads(p.read_text()).get("decode", {})
    ]
    assert {m.name for m in loaded} >= {"cpu-tiny-llama-bench", "h100-sglang-llama-3.1-8b"}
    for m in loaded:
        assert m.prefill_seconds([(1000, 0)]) > 0 and m.decode_seconds(8, 8000) > 0


def test_cpu_profiles_run_the_forward_inside_the_launch_and_gpu_profiles_do_not():
    # The emulator times SGLang's overlap loop by this: on a CPU run_batch returns when the
    # forward is done, so the next batch is selected after it; on a GPU while it runs.
    from pathlib import Path

    profiles = Path(__file__).resolve().parents[2] / "configs" / "profiles"
    for p in sorted(profiles.glob("*.json")):
        data = json.loads(p.read_text())
        if "coeffs" not in data.get("decode", {}):
            continue
        assert StepLatencyModel.load(p).synchronous_forward == p.name.startswith("cpu-"), p.name
    assert StepLatencyModel(prefill=(0, 0, 0), decode=(0, 0, 0)).synchronous_forward is False
