"""Tier 3: real mini-swe-agent programs (``continuum-agents``) against the continuum server."""

import json
from argparse import Namespace

import pytest

from continuum_lab.bench.attribution import read_log
from continuum_lab.cli.agents.fleet import run_fleet
from continuum_lab.cli.agents.tasks import IDENTITY_SERIES, load_tasks
from continuum_lab.workloads.importer import import_files
from sglang_continuum.client.mini_swe_agent import release_program
from tests.e2e.conftest import serving
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.e2e
pytest.importorskip("minisweagent", reason="requirements/agents.txt")


@pytest.fixture(scope="module")
def attribution_log(tmp_path_factory):
    """Where the server logs the program it attributed each request with no id to."""
    return tmp_path_factory.mktemp("attribution") / "attribution.jsonl"


@pytest.fixture(scope="module")
def agents_server(tiny_model, tmp_path_factory, attribution_log):
    """mini-swe-agent's own v2 templates make ~2k-token prompts: a pool for a few programs."""
    log = tmp_path_factory.mktemp("logs") / "agents.log"
    env = {
        **fixed_ttl_env(30),
        "SGLANG_CONTINUUM_EVENT_LOG": str(attribution_log),  # attributions: for requests with no id only
    }
    args = [
        "--schedule-policy",
        "continuum",
        "--max-total-tokens",
        "16384",
        "--enable-metrics",
        "--enable-cache-report",
    ]
    with serving(tiny_model, args, env=env, log_path=log) as srv:
        yield srv


def write_task(root, name: str, commands: list[str]) -> None:
    folder = root / name
    (folder / "repo").mkdir(parents=True)
    (folder / "repo" / "notes.txt").write_text(f"{name}\n")
    task = {"task": f"Look at notes.txt for {name}.", "commands": commands, "submit": False}
    (folder / "task.json").write_text(json.dumps(task))


def agent_args(out, **overrides) -> Namespace:
    base = dict(
        mode="text",
        grammar=True,
        temperature=0.0,
        step_limit=3,
        max_tokens=160,
        command_timeout_s=30,
        model_name="tiny",
        concurrency=2,
        repeat=1,
        out=out,
    )
    return Namespace(**(base | overrides))


def test_two_concurrent_agents_hit_their_pins_and_leave_none(agents_server, tmp_path):
    """Two programs of 3 steps each, concurrently; every step really runs ``sleep 0.4``."""
    tasks_dir = tmp_path / "tasks"
    for name in ("alpha", "beta"):
        write_task(tasks_dir, name, ["sleep 0.4 && cat notes.txt"])
    args = agent_args(tmp_path / "out")
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
    assert delta.get('sglang:continuum_programs_ended_total{reason="last_step"}', 0) == 2  # the step limit's turn
    assert summary["pins_left_at_end"] == 0
    # the trajectories import as workload programs with the real tool times
    programs = import_files(sorted((tmp_path / "out" / "trajectories").glob("*.json")), lambda s: len(s.split()))
    assert len(programs) == 2
    for program in programs:
        assert [t.tool for t in program.turns[:-1]] == ["sleep", "sleep"]
        assert all(t.tool_duration_s >= 0.4 for t in program.turns[:-1])


def test_plain_mini_swe_agent_programs_are_inferred_and_their_later_turns_hit_pins(
    agents_server, attribution_log, tmp_path
):
    """``--plain``: mini-swe-agent's stock model class, no program metadata (only the grammar in
    ``extra_body``). The server must find each run's later turns from the prefix: the first turn
    continues nothing and, with no earlier first turn continued on this server, is served as under
    fcfs; every later one continues its own run's program."""
    tasks_dir = tmp_path / "tasks"
    for name in ("gamma", "delta"):  # prompts unlike the other test's: nothing of theirs is cached
        write_task(tasks_dir, name, ["sleep 0.4 && cat notes.txt"])
    logged_before = set(read_log(attribution_log))
    run = run_fleet(
        agents_server.url,
        load_tasks(tasks_dir),
        agent_args(tmp_path / "out"),
        "continuum-plain",
        plain=True,
        attribution_log=attribution_log,
    )
    summary = run["summary"]
    log = read_log(attribution_log)
    try:
        assert run["identity"] == "plain"
        assert summary["ended"] == 2, run["tasks"]
        by = summary["requests_by_source"]
        # nothing was sent: no explicit source counted; 2 first turns with no program, 4 later turns inferred
        assert by["program_id"] == by["session_id"] == by["routing_key"] == 0, by
        assert by["none"] == 2 and by["inferred"] == 4, by
        assert set(by) == set(IDENTITY_SERIES)
        for task in run["tasks"]:
            turns = task["turns"]
            assert task["steps"] == 3 and len(turns) == 3
            assert all(t["rid"] for t in turns)
            # later turns find the previous context cached (the inferred program's pin after turn 2)
            assert all(t["cached_tokens"] > 0.8 * turns[i]["prompt_tokens"] for i, t in enumerate(turns[1:])), turns
            # the server logged each turn under one program: its first turn's provisional id
            programs = [log[t["rid"]] for t in turns]
            assert [source for _, source in programs] == ["none", "inferred", "inferred"], programs
            assert len({pid for pid, _ in programs}) == 1, programs
        # one pin per program is hit: the one after the second turn (the first turn was no program yet)
        assert summary["pin_hits"] >= 2 and summary["pins_created"] >= 2, summary
        assert summary["attribution"]["recall"] == 1.0 and summary["attribution"]["precision"] == 1.0
        assert summary["attribution"]["turns_after_first"] == 4
    finally:
        # the module's server is shared: release the inferred programs (their pins would last the TTL)
        for pid in {pid for rid, (pid, _) in log.items() if rid not in logged_before}:
            release_program(agents_server.url, pid)
