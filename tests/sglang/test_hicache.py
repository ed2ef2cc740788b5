"""Tier 2: Continuum with SGLang's real HiCache in a real Scheduler (scenarios and their
assertions in ``hicache_scenarios.py``; each runs in a fresh interpreter, see there)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
ROOT = Path(__file__).resolve().parents[2]


def run_scenario(scenario: str, model: str, write_policy: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env = {k: v for k, v in env.items() if not k.startswith("SGLANG_CONTINUUM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.sglang.hicache_scenarios", scenario, model, write_policy],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.parametrize("write_policy", ["write_through_selective", "write_through", "write_back"])
def test_expired_pin_goes_to_host_and_next_turn_loads_it_back(tiny_model, write_policy):
    run_scenario("expired_pin_goes_to_host_and_next_turn_loads_it_back", tiny_model, write_policy)


def test_without_continuum_the_same_sequence_recomputes(tiny_model):
    # write_through_selective backs a prefix up only on its second use: plain fcfs drops it
    run_scenario("without_continuum_the_same_sequence_recomputes", tiny_model, "write_through_selective")


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_hinted_return_finds_its_prefix_uploaded(tiny_model, write_policy):
    run_scenario("hinted_return_finds_its_prefix_uploaded", tiny_model, write_policy)


def test_unhinted_cold_return_loads_its_prefix_itself(tiny_model):
    run_scenario("unhinted_cold_return_loads_its_prefix_itself", tiny_model, "write_through")
