"""Tier 3: the offline ``sglang.Engine(schedule_policy="continuum")`` path (plugin loaded by the
Engine in this process and in its spawned scheduler)."""

import pytest

pytestmark = pytest.mark.e2e


def test_offline_engine_with_continuum(tiny_model):
    import sglang

    engine = sglang.Engine(
        model_path=tiny_model, schedule_policy="continuum", device="cpu", attention_backend="torch_native",
        max_total_tokens=2048, enable_cache_report=True, log_level="error",
    )
    try:
        ids = [(7 * i) % 490 + 5 for i in range(120)]
        sp = {"max_new_tokens": 4, "ignore_eos": True,
              "custom_params": {"program_id": "offline-1", "is_last_step": False}}
        first = engine.generate(input_ids=ids, sampling_params=sp)
        sp = {**sp, "custom_params": {"program_id": "offline-1", "is_last_step": True}}
        second = engine.generate(input_ids=ids + first["output_ids"] + [9, 9, 9], sampling_params=sp)
        assert second["meta_info"]["cached_tokens"] == len(ids) + 4 - 1
    finally:
        engine.shutdown()
