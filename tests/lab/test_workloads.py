import json
from pathlib import Path

import numpy as np
import pytest

from continuum_lab.workloads.generate import SPECS, generate, summary
from continuum_lab.workloads.importer import import_files, messages_to_program
from continuum_lab.workloads.schema import WorkloadError, dump_workload, load_workload, parse_workload

DATA = (
    Path(__file__).resolve().parents[1] / "data" / "swe_smith_5_trajectories_with_tool_times.json"
)  # see tests/data/README.md
GOOD = {
    "program_id": "p",
    "turns": [
        {"append_tokens": 10, "output_tokens": 2, "tool": "ls", "tool_duration_s": 0.5},
        {"append_tokens": 3, "output_tokens": 2},
    ],
}


def test_round_trip(tmp_path):
    progs = parse_workload([json.dumps(GOOD)])
    assert progs[0].context_tokens == 17 and progs[0].prefill_tokens == 10 + 15
    path = dump_workload(progs, tmp_path / "w.jsonl")
    assert load_workload(path) == progs


@pytest.mark.parametrize(
    "line,problem",
    [
        ("{not json", "2: not JSON"),
        (json.dumps({"program_id": "q", "turns": []}), "2: turns: List should have at least 1 item"),
        (
            json.dumps({"program_id": "q", "turns": [{"append_tokens": 0, "output_tokens": 1}]}),
            "2: turns.0.append_tokens",
        ),
        (
            json.dumps({"program_id": "q", "turns": [{"append_tokens": 1, "output_tokens": 1, "tool_duration_s": -1}]}),
            "2: turns.0.tool_duration_s",
        ),
        (
            json.dumps({"program_id": "q", "turns": [{"append_tokens": 1, "output_tokens": 1, "tool_duration_s": 2}]}),
            "2: Value error, the last turn calls no tool",
        ),
        (
            json.dumps({"program_id": "q", "turns": [{"append_tokens": 1, "output_tokens": 1, "colour": 1}]}),
            "2: turns.0.colour: Extra inputs",
        ),
        (json.dumps(GOOD), "2: duplicate program_id 'p'"),
    ],
)
def test_validator_names_line_and_problem(line, problem):
    with pytest.raises(WorkloadError) as exc:
        parse_workload([json.dumps(GOOD), line], "w.jsonl")
    assert f"w.jsonl:{problem}" in str(exc.value)


def test_empty_workload_rejected():
    with pytest.raises(WorkloadError, match="no programs"):
        parse_workload(["", "  "])


# Tolerances on 2,000 programs: turn and token means within 5%, their stds within 15%. Tool times
# are long-tailed (lognormal mixtures): their mean is within 10%, and the std, dominated by a few
# extreme samples, within a factor of 2 for SWE-bench (CV ~ 3.8) and 15% for BFCL (CV ~ 1.1).
@pytest.mark.parametrize("kind,tool_std_tol", [("swe", 1.0), ("bfcl", 0.15)])
def test_generators_hit_the_paper_statistics(kind, tool_std_tol):
    spec = SPECS[kind]
    s = summary(generate(kind, 2000, seed=0))
    assert s["turns_mean"] == pytest.approx(spec.turns_mean, rel=0.05)
    assert s["turns_std"] == pytest.approx(spec.turns_std, rel=0.15)
    assert s["tokens_mean"] == pytest.approx(spec.tokens_mean, rel=0.05)
    assert s["tokens_std"] == pytest.approx(spec.tokens_std, rel=0.15)
    assert s["tool_ms_mean"] == pytest.approx(spec.tool_mean_s * 1000, rel=0.10)
    assert s["tool_ms_std"] == pytest.approx(spec.tool_std_s * 1000, rel=tool_std_tol)


def test_generators_are_seeded_and_scale():
    a, b = generate("swe", 20, seed=3), generate("swe", 20, seed=3)
    assert a == b and a != generate("swe", 20, seed=4)
    small = summary(generate("swe", 500, seed=1, token_scale=0.02))
    assert small["tokens_mean"] == pytest.approx(0.02 * SPECS["swe"].tokens_mean, rel=0.1)
    rep = generate("swe", 300, seed=1, turn_repeat=3)
    base = generate("swe", 300, seed=1)
    assert np.mean([len(p.turns) for p in rep]) == pytest.approx(3 * np.mean([len(p.turns) for p in base]), rel=0.01)
    assert summary(rep)["tokens_mean"] == pytest.approx(summary(base)["tokens_mean"], rel=0.05)
    outs = np.mean(
        [t.output_tokens for p in generate("swe", 300, seed=1, token_scale=0.02, output_scale=0.2) for t in p.turns]
    )
    assert outs == pytest.approx(0.2 * SPECS["swe"].output_tokens_mean, rel=0.1)
    capped = generate("swe", 200, seed=1, max_tool_s=2.0)
    assert max(t.tool_duration_s for p in capped for t in p.turns) <= 2.0


def test_importer_round_trips_the_real_trajectories():
    progs = import_files([DATA], count=lambda text: len(text.split()))
    raw = json.loads(DATA.read_text())
    assert len(progs) == 5
    for prog, traj in zip(progs, raw):
        msgs = json.loads(traj["messages"])
        assistants = [m for m in msgs if m["role"] == "assistant"]
        assert len(prog.turns) == len(assistants)
        expected = [sum(c["execution_time_seconds"] for c in m["tool_calls"]) for m in assistants[:-1]]
        assert [t.tool_duration_s for t in prog.turns[:-1]] == pytest.approx(expected)
        assert prog.turns[-1].tool is None and prog.turns[-1].tool_duration_s == 0.0
        assert prog.program_id == traj["traj_id"]


def test_importer_mini_swe_agent_messages():
    msgs = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "THOUGHT: look\n```bash\ncd /repo && grep -rn bug .\n```"},
        {"role": "user", "content": "<output>a.py:1: bug</output>", "extra": {"duration": 0.25}},
        {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"},
    ]
    prog = messages_to_program("m", msgs, lambda t: len(t.split()), default_tool_s=1.5)
    assert [t.tool for t in prog.turns] == ["grep", None]
    assert prog.turns[0].tool_duration_s == 1.5  # mini-swe-agent records no time on the call


def test_generate_leaves_out_programs_past_a_context_limit(tmp_path, capsys):
    from continuum_lab.workloads.generate import main, peak_context

    everything = generate("swe", 40, seed=0)
    limit = sorted(peak_context(p) for p in everything)[-3]  # the two longest programs go
    out = tmp_path / "w.jsonl"
    assert main(["swe", "--programs", "40", "--seed", "0", "--max-context", str(limit), "--out", str(out)]) == 0
    kept = load_workload(out)
    assert len(kept) == 38 and all(peak_context(p) <= limit for p in kept)
    assert capsys.readouterr().out.count("left out") == 2


def test_tool_scale_shrinks_tool_time_of_the_same_programs():
    base = generate("swe", 30, seed=2, max_tool_s=4)
    scaled = generate("swe", 30, seed=2, max_tool_s=4, tool_scale=0.5)
    assert [len(p.turns) for p in scaled] == [len(p.turns) for p in base]
    assert [t.append_tokens for p in scaled for t in p.turns] == [t.append_tokens for p in base for t in p.turns]
    got = [t.tool_duration_s for p in scaled for t in p.turns]
    assert got == pytest.approx([t.tool_duration_s * 0.5 for p in base for t in p.turns], abs=1e-4)
    assert max(got) <= 2.0  # clipped at 4 s, then scaled


@pytest.mark.parametrize(
    "name, args",
    [
        ("swe-cpu-prefill-72", ["--token-scale", "0.06", "--output-scale", "0.03", "--max-tool-s", "4"]),
        (
            "swe-cpu-prefill-72-small",
            ["--token-scale", "0.04", "--output-scale", "0.03", "--max-tool-s", "4", "--tool-scale", "0.5"],
        ),
    ],
)
def test_shipped_cpu_workloads_are_what_their_commands_write(tmp_path, name, args):
    from continuum_lab.workloads.generate import main

    out = tmp_path / "w.jsonl"
    assert main(["swe", "--programs", "72", "--seed", "7", *args, "--out", str(out)]) == 0
    shipped = Path(__file__).resolve().parents[2] / "workloads" / f"{name}.jsonl"
    assert out.read_bytes() == shipped.read_bytes()
