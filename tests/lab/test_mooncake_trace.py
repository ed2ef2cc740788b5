"""The converter to AIPerf's ``mooncake_trace`` (``continuum_lab/workloads/mooncake_trace.py``): one
row per turn, a session's turns together, the previous turn's tool time as the next row's delay;
tokens scaled by the generator's rule; the file reads back as the programs it was made from; the
committed CPU trace is what the documented command makes; and, where ``.venv-aiperf`` exists,
AIPerf 0.13.0's own loader accepts every row."""

import json
import subprocess
from pathlib import Path

import pytest

from continuum_lab.harness.aiperf import AIPERF_VENV
from continuum_lab.workloads.formats import import_weka
from continuum_lab.workloads.mooncake_trace import (
    evenly_spaced,
    load_source,
    main,
    mooncake_rows,
    read_trace,
    scale_tokens,
    write_trace,
)
from continuum_lab.workloads.schema import Program, Turn, load_workload

ROOT = Path(__file__).resolve().parents[2]
WEKA = ROOT / "tests" / "data" / "kv_cache_tester_trace_0010_cut.json"
CORPUS = ROOT / "workloads" / "imported" / "claude-code-kvtester.jsonl"
CPU_TRACE = ROOT / "workloads" / "aiperf" / "claude-code-kvtester-cpu.mooncake.jsonl"


def program(pid: str, *turns: tuple[int, int, float]) -> Program:
    return Program(
        program_id=pid,
        turns=[
            Turn(append_tokens=a, output_tokens=o, tool="bash" if g else None, tool_duration_s=g) for a, o, g in turns
        ],
    )


def test_one_row_per_turn_with_the_previous_tool_time_as_delay():
    progs = [program("a", (100, 7, 2.5), (30, 4, 0.25), (12, 3, 0.0)), program("b", (50, 5, 0.0))]
    assert list(mooncake_rows(progs)) == [
        {"session_id": "a", "input_length": 100, "output_length": 7},
        {"session_id": "a", "input_length": 30, "output_length": 4, "delay": 2500.0},
        {"session_id": "a", "input_length": 12, "output_length": 3, "delay": 250.0},
        {"session_id": "b", "input_length": 50, "output_length": 5},
    ]


def test_gaps_capped_in_the_file_when_asked():
    rows = list(mooncake_rows([program("a", (10, 1, 30.0), (10, 1, 4.0), (10, 1, 0.0))], max_gap_s=10))
    assert [r.get("delay") for r in rows] == [None, 10000.0, 4000.0]


def test_tokens_scale_by_the_generators_rule_and_tool_times_stay():
    scaled = scale_tokens(program("a", (15818, 154, 3.0), (31, 9, 0.0)), 0.05)
    assert [(t.append_tokens, t.output_tokens, t.tool_duration_s) for t in scaled.turns] == [
        (791, 8, 3.0),  # round(790.9), round(7.7)
        (2, 1, 0.0),  # round(1.55); round(0.45) -> at least 1
    ]


def test_the_file_reads_back_as_its_programs(tmp_path):
    progs = [program("a", (100, 7, 2.5), (30, 4, 0.0)), program("b/agent_1", (50, 5, 1.0), (9, 2, 0.0))]
    back = read_trace(write_trace(progs, tmp_path / "t.jsonl"))
    assert [(p.program_id, [(t.append_tokens, t.output_tokens, t.tool_duration_s) for t in p.turns]) for p in back] == [
        (p.program_id, [(t.append_tokens, t.output_tokens, t.tool_duration_s) for t in p.turns]) for p in progs
    ]


def test_raw_kv_cache_tester_traces_convert_through_the_importer(tmp_path):
    progs = load_source([WEKA])
    # the 4 sub-agents, the parent, and the parent after its context shrank (a new program)
    assert progs == import_weka(WEKA).programs and len(progs) == 6
    out = tmp_path / "w.mooncake.jsonl"
    assert main([str(WEKA), "--token-scale", "0.1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == sum(len(p.turns) for p in progs)
    assert [r["session_id"] for r in rows] == [p.program_id for p in progs for _ in p.turns]
    assert rows[0]["input_length"] == round(progs[0].turns[0].append_tokens * 0.1)


def test_evenly_spaced_keeps_the_corpus_spread():
    progs = [program(str(i), (1, 1, 0.0)) for i in range(10)]
    assert [p.program_id for p in evenly_spaced(progs, 4)] == ["0", "2", "5", "7"]
    assert evenly_spaced(progs, 0) == progs and evenly_spaced(progs, 20) == progs


def test_max_context_leaves_long_programs_out(tmp_path):
    source = tmp_path / "w.jsonl"
    source.write_text(
        "\n".join(p.model_dump_json() for p in [program("short", (10, 1, 0.0)), program("long", (900, 100, 0.0))])
    )
    out = tmp_path / "t.jsonl"
    assert main([str(source), "--max-context", "500", "--out", str(out)]) == 0
    assert [p.program_id for p in read_trace(out)] == ["short"]


def test_the_committed_cpu_trace_is_what_the_documented_command_makes(tmp_path):
    out = tmp_path / "cpu.jsonl"
    main([str(CORPUS), "--token-scale", "0.05", "--programs", "100", "--out", str(out)])
    assert out.read_bytes() == CPU_TRACE.read_bytes()
    progs = read_trace(CPU_TRACE)
    assert CPU_TRACE.stat().st_size < 300_000  # small enough to commit
    assert max(p.context_tokens for p in progs) < 32_768  # the tiny model's positions
    corpus = {p.program_id for p in load_workload(CORPUS)}
    assert len(progs) == 100 and {p.program_id for p in progs} <= corpus


@pytest.mark.skipif(
    not (ROOT / AIPERF_VENV / "bin" / "python").exists(), reason="no .venv-aiperf (bash scripts/setup-aiperf.sh)"
)
def test_aiperfs_own_loader_accepts_every_row():
    check = (
        "import json, sys\n"
        "from aiperf.dataset.loader.models import MooncakeTrace\n"
        "from aiperf.dataset.loader.mooncake_trace import MooncakeTraceDatasetLoader as L\n"
        "rows = [json.loads(x) for x in open(sys.argv[1])]\n"
        "assert all(L.can_load(r) and MooncakeTrace.model_validate(r).session_id for r in rows)\n"
        "print(len(rows))\n"
    )
    done = subprocess.run(
        [str(ROOT / AIPERF_VENV / "bin" / "python"), "-c", check, str(CPU_TRACE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) == sum(len(p.turns) for p in read_trace(CPU_TRACE))
