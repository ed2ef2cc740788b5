"""Tier 3: the offline ``sglang.Engine(schedule_policy="continuum")`` path.

Run in its own interpreter: ``Engine.shutdown()`` kills every child process of the process that
made the engine, which would include the other end-to-end tests' servers.
"""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import sglang

    engine = sglang.Engine(
        model_path=sys.argv[1], schedule_policy="continuum", device="cpu", attention_backend="torch_native",
        max_total_tokens=2048, enable_cache_report=True, log_level="error",
    )
    try:
        ids = [(7 * i) % 490 + 5 for i in range(120)]
        sp = {"max_new_tokens": 4, "ignore_eos": True,
              "custom_params": {"program_id": "offline-1", "is_last_step": False}}
        first = engine.generate(input_ids=ids, sampling_params=sp)
        sp = {**sp, "custom_params": {"program_id": "offline-1", "is_last_step": True}}
        second = engine.generate(input_ids=ids + first["output_ids"] + [9, 9, 9], sampling_params=sp)
        print("RESULT " + json.dumps({"context": len(ids) + 4, "cached": second["meta_info"]["cached_tokens"]}))
    finally:
        engine.shutdown()
    """
)


def test_offline_engine_with_continuum(tiny_model):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model], capture_output=True, text=True, timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["cached"] == result["context"] - 1  # the whole previous context, minus the last token
