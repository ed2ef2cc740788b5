"""Tier 3: real mini-swe-agent programs (``continuum-agents``) against the continuum server."""

import json
from argparse import Namespace

import pytest

from sglang_continuum.cli.agents import load_tasks, run_fleet
from sglang_continuum.harness.server import SGLangServer
from sglang_continuum.workloads.importer import import_files

pytestmark = pytest.mark.e2e
pytest.importorskip("minisweagent", reason="requirements/agents.txt")


@pytest.fixture(scope="module")
def agents_server(tiny_model, tmp_path_factory):
    """mini-swe-agent's own v2 templates make ~2k-token prompts: a pool for a few programs."""
    log = tmp_path_factory.mktemp("logs") / "agents.log"
    env = {"SGLANG_CONTINUUM_TTL_MODEL": "fixed", "SGLANG_CONTINUUM_FIXED_TTL_S": "30"}
    args = [
        "--schedule-policy",
        "continuum",
        "--max-total-tokens",
        "16384",
        "--enable-metrics",
        "--enable-cache-report",
    ]
    with SGLangServer(tiny_model, args, env=env, log_path=log) as srv:
        yield srv


def write_task(root, name: str, commands: list[str]) -> None:
    folder = root / name
    (folder / "repo").mkdir(parents=True)
    (folder / "repo" / "notes.txt").write_text(f"{name}\n")
    task = {"task": f"Look at notes.txt for {name}.", "commands": commands, "submit": False}
    (folder / "task.json").write_text(json.dumps(task))


def test_two_concurrent_agents_hit_their_pins_and_leave_none(agents_server, tmp_path):
    """Two programs of 3 steps each, concurrently; every step really runs ``sleep 0.4``."""
    tasks_dir = tmp_path / "tasks"
    for name in ("alpha", "beta"):
        write_task(tasks_dir, name, ["sleep 0.4 && cat notes.txt"])
    args = Namespace(
        mode="text",
        grammar=True,
        temperature=0.0,
        step_limit=3,
        max_tokens=160,
        command_timeout_s=30,
        model_name="tiny",
        concurrency=2,
        repeat=1,
        out=tmp_path / "out",
    )
    run = run_fleet(agents_server.url, load_tasks(tasks_dir), args, "continuum")
    summary = run["summary"]
    assert summary["ended"] == 2, run["tasks"]
    for task in run["tasks"]:
        assert task["exit_status"] == "LimitsExceeded" and task["steps"] == 3
        turns = task["turns"]
        assert len(turns) == 3
        # the real command's wall time is the recorded tool time
        assert all(t["tool"] == "sleep" and t["tool_s"] >= 0.4 for t in turns), turns
        # later turns find the earlier context cached (the pin kept it through the tool call)
        assert all(t["cached_tokens"] > 0.8 * turns[i]["prompt_tokens"] for i, t in enumerate(turns[1:])), turns
    delta = summary["metrics_delta"]
    assert delta.get("sglang:continuum_pin_hits_total", 0) >= 4  # 2 programs x 2 returning turns
    assert delta.get("sglang:continuum_programs_ended_last_step_total", 0) == 2  # the step limit's turn
    assert summary["pins_left_at_end"] == 0
    # the trajectories import as workload programs with the real tool times
    programs = import_files(sorted((tmp_path / "out" / "trajectories").glob("*.json")), lambda s: len(s.split()))
    assert len(programs) == 2
    for program in programs:
        assert [t.tool for t in program.turns[:-1]] == ["sleep", "sleep"]
        assert all(t.tool_duration_s >= 0.4 for t in program.turns[:-1])
