"""Tier 2: ``continuum-bench --applications --emulate`` on SGLang's real scheduler in virtual time:
a tiny grid of multi-agent applications, every agent of every application run, each application
no sooner done than the tool time along its longest path allows."""

import json
from pathlib import Path

import pytest

from continuum_lab.bench.replay import arrival_times
from continuum_lab.workloads.applications import dump_applications, tool_bound_s
from continuum_lab.workloads.multi_agent import generate_applications

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "configs" / "profiles" / "h100-sglang-llama-3.1-8b.json"


def test_bench_emulate_runs_every_agent_of_every_application_after_its_dependencies(tmp_path):
    from continuum_lab.cli.bench import main

    # one of each, small: every emulated step runs SGLang's strict pool checks here (tests/conftest.py)
    small = {"token_scale": 0.05, "output_scale": 0.01}
    apps = [
        *generate_applications("code-writer", 1, seed=1, tool_scale=0.5, **small),
        *generate_applications("deep-research", 1, seed=1, tool_scale=0.2, **small),
    ]
    path = dump_applications(apps, tmp_path / "apps.jsonl")
    out = tmp_path / "bench"
    policies = ["fcfs", "continuum"]
    argv = ["--emulate", str(PROFILE), "--applications", str(path), "--aps", "1", "--policies", ",".join(policies),
            "--seeds", "1", "--jobs", "2", "--hints", "--kv-sample-s", "0.5", "--max-total-tokens", "6000",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["backend"] == "emulator" and [r["policy"] for r in report["runs"]] == policies
    arrivals = arrival_times(len(apps), 1.0, 1)
    for policy in policies:
        run = json.loads((out / "runs" / f"{policy}-aps1-s1-r0.json").read_text())
        records = {p["program_id"]: p for p in run["replay"]["programs"]}
        assert set(records) == {app.program_id(a) for app in apps for a in app.agents}
        assert all(p["ok"] for p in records.values())
        for app, at in zip(apps, arrivals):
            agents = {a.agent_id: records[app.program_id(a)] for a in app.agents}
            for a in app.agents:  # an agent starts once its dependencies have ended
                assert all(agents[a.agent_id]["start"] >= agents[d]["end"] for d in a.depends_on)
            assert max(p["end"] for p in agents.values()) - at >= tool_bound_s(app) - 1e-6
        assert run["kv_samples"] and all(0.0 <= s[1] <= s[2] <= 1.0 for s in run["kv_samples"])
    figures = report["runs"][0]["figures"]
    assert figures["finished_apps"] == len(apps) and figures["failed_apps"] == 0
    assert figures["kv_used_mean"] is not None and figures["kv_series"]
    md = (out / "report.md").read_text()
    assert "**Emulated, predictions**" in md and "mean app latency s" in md and "abnormal agents" in md
