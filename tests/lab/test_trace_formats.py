"""continuum-import --format weka|agentperf|lmcache on the samples in tests/data (see its README):
each imported Workload equals what the sample says, computed here by hand, and round-trips through
the schema's writer; what does not fit is reported per program and the rest imports."""

import json
from pathlib import Path

import pytest

from continuum_lab.workloads.formats import chars_per_4
from continuum_lab.workloads.importer import import_paths, main
from continuum_lab.workloads.schema import dump_workload, load_workload

DATA = Path(__file__).resolve().parents[1] / "data"
WEKA = DATA / "kv_cache_tester_trace_0010_cut.json"
AGENTPERF = DATA / "agentperf_synthetic_fix_typo.jsonl"
LMCACHE_SWE = DATA / "lmcache_miniswe_189f0222.jsonl"
LMCACHE_TAU = DATA / "lmcache_taubench_5cacdab4.jsonl"


def words(text: str) -> int:
    return len(text.split())


def turns(prog):
    return [(t.append_tokens, t.output_tokens, t.tool, t.tool_duration_s) for t in prog.turns]


def round_trips(programs, tmp_path):
    path = dump_workload(programs, tmp_path / "w.jsonl")
    assert load_workload(path) == programs


def test_weka_programs_turns_and_tool_times(tmp_path):
    result = import_paths([WEKA], "weka", words)
    assert result.problems == []
    progs = {p.program_id: p for p in result.programs}
    raw = json.loads(WEKA.read_text())["requests"]
    parent = [r for r in raw if r["type"] != "subagent"]
    subs = [r for r in raw if r["type"] == "subagent"]
    # The parent shrinks once (147900 -> 62332 tokens, a compaction): two programs; 4 sub-agents.
    assert sorted(progs) == sorted(["trace_0010", "trace_0010-1"] + [f"trace_0010/{s['agent_id']}" for s in subs])
    assert len(progs["trace_0010"].turns) + len(progs["trace_0010-1"].turns) == len(parent)
    # By hand from the sample: first request (17209 in, 275 out) is followed by sub-agent 1 and the
    # next request's think_time 98 s; the second request adds 22038 - 17209 - 275 tokens.
    first = turns(progs["trace_0010"])
    assert first[0] == (17209, 275, "subagent", 98.0)
    assert first[1] == (22038 - 17209 - 275, 162, "tool_use", 9.0)
    # 131922 < 130978 + 963: part of the output was dropped; the growth is clamped to 1 token.
    assert first[5] == (1, 38, "tool_use", 89.0)
    assert first[6][2] == "human"  # request 316 s stopped with end_turn: a person replies (66 s)
    assert first[6][3] == 66.0
    assert first[-1][2:] == (None, 0.0)
    assert turns(progs["trace_0010-1"])[0][:2] == (62332, 225)
    for s in subs:
        rs = s["requests"]
        expected = [rs[0]["in"]] + [b["in"] - a["in"] - a["out"] for a, b in zip(rs, rs[1:])]
        got = turns(progs[f"trace_0010/{s['agent_id']}"])
        assert [g[0] for g in got] == [max(1, e) for e in expected]
        assert [g[1] for g in got] == [r["out"] for r in rs]
        assert [g[3] for g in got] == [r["think_time"] for r in rs[1:]] + [0.0]
        assert {g[2] for g in got[:-1]} == {"tool_use"}
    round_trips(result.programs, tmp_path)


def test_weka_max_context_and_missing_field_reported_per_program(tmp_path):
    # Final contexts: trace_0010 148253 (recorded 148233, +20 from the clamped growth),
    # trace_0010-1 149271, agent_002 140136 tokens; the rest fit.
    result = import_paths([WEKA], "weka", words, max_context=140_000)
    assert {p.program_id for p in result.programs} == {
        "trace_0010/agent_001",
        "trace_0010/agent_003",
        "trace_0010/agent_004",
    }
    assert len(result.problems) == 3
    assert any(
        f"{WEKA} requests[10].requests[0]: program trace_0010/" in p
        and "agent_002 left out: context 140136 tokens > --max-context 140000" in p
        for p in result.problems
    )
    data = json.loads(WEKA.read_text())
    del data["requests"][3]["out"]  # the parent's third request
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    result = import_paths([broken], "weka", words)
    assert result.problems == [
        f"{broken} requests[0]: program trace_0010 left out: {broken} requests[3]: missing or bad out"
    ]
    ids = {p.program_id for p in result.programs}
    # The request after the broken one starts a new program with its whole context; the rest imports.
    assert "trace_0010-1" in ids and "trace_0010-2" in ids and len(ids) == 6
    assert next(p for p in result.programs if p.program_id == "trace_0010-1").turns[0].append_tokens == 130398


def test_agentperf_recorded_counts_and_tool_calls(tmp_path):
    result = import_paths([AGENTPERF], "agentperf", words)
    assert result.problems == []
    (prog,) = result.programs
    assert prog.program_id == "fix-typo"
    # Rows by hand: prompt 412/458/540/563, outputs 31/52/17/9, tool delays 120.5, 80 + 45.25, 2000 ms.
    assert turns(prog) == [
        (412, 31, "bash:grep", 0.1205),
        (458 - 412 - 31, 52, "bash:sed", 0.12525),
        (540 - 458 - 52, 17, "submit", 2.0),
        (563 - 540 - 17, 9, None, 0.0),
    ]
    round_trips(result.programs, tmp_path)


def test_agentperf_counts_messages_without_recorded_tokens_and_reports_missing_output(tmp_path):
    rows = [json.loads(line) for line in AGENTPERF.read_text().splitlines()]
    for r in rows:
        del r["recorded_prompt_tokens"]
    del rows[2]["target_output_tokens"], rows[2]["recorded_completion_tokens"]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = import_paths([path], "agentperf", chars_per_4, keep_text=True)
    assert result.problems == [f"{path}:1: program fix-typo left out: {path}:3: missing target_output_tokens"]
    (prog,) = result.programs  # row 4 starts a new program: its whole conversation is its prompt
    assert prog.program_id == "fix-typo-1" and len(prog.turns) == 1
    text = prog.turns[0].text
    assert "Fix the typo" in text and "submitted" in text
    assert prog.turns[0].append_tokens == chars_per_4(text)


def _lmcache_rows(path):
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["timestamp"])


def test_lmcache_mini_swe_agent_session(tmp_path):
    result = import_paths([LMCACHE_SWE], "lmcache", words, keep_text=True)
    assert result.problems == []
    (prog,) = result.programs
    rows = _lmcache_rows(LMCACHE_SWE)
    assert prog.program_id == rows[0]["session_id"] and len(prog.turns) == len(rows) == 6
    # The recorder's input holds the prompts and observations, not the model's outputs: each input
    # extends the previous input; the appended text is the new observation.
    added = [rows[0]["input"]] + [b["input"][len(a["input"]) :] for a, b in zip(rows, rows[1:])]
    assert [t.text for t in prog.turns] == added
    assert [t.append_tokens for t in prog.turns] == [max(1, words(a)) for a in added]
    assert [t.output_tokens for t in prog.turns] == [words(r["output"]) for r in rows]
    gaps = [(b["timestamp"] - a["timestamp"]) / 1e6 for a, b in zip(rows, rows[1:])]
    assert [t.tool_duration_s for t in prog.turns] == pytest.approx(gaps + [0.0])
    assert [t.tool for t in prog.turns] == ["grep", "grep", "grep", "sed", "grep", None]
    round_trips(result.programs, tmp_path)


def test_lmcache_tau_bench_two_sides_and_bad_line(tmp_path):
    # tau-bench sessions log both the simulated user and the agent: two interleaved contexts.
    result = import_paths([LMCACHE_TAU], "lmcache", words)
    assert result.problems == []
    assert [p.program_id for p in result.programs] == [
        "5cacdab43997ef46db773ba7a7d4aa13",
        "5cacdab43997ef46db773ba7a7d4aa13-1",
    ]
    assert sum(len(p.turns) for p in result.programs) == len(_lmcache_rows(LMCACHE_TAU))
    assert result.programs[0].turns[0].append_tokens == words("Hi! How can I help you today?")
    round_trips(result.programs, tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text(LMCACHE_TAU.read_text() + '{"timestamp": 1, "output": "x"}\n')
    result = import_paths([path], "lmcache", words)
    assert len(result.programs) == 2
    assert result.problems == [f"{path}:18: program t-line18 left out: missing or bad input"]


def test_cli_writes_the_rest_and_reports(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    assert main([str(WEKA), "--format", "weka", "--max-context", "140000", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "3 programs" in captured.out and "3 left out" in captured.out
    assert captured.err.count("left out: context") == 3
    assert len(load_workload(out)) == 3
    assert main([str(WEKA), "--format", "weka", "--max-context", "10", "--out", str(tmp_path / "x")]) == 1
