"""An RL rollout step (``workloads/rollout.py``) and ``continuum-bench --rollout``: groups that share
exactly their first prompt, every program released at once, the makespan and its report."""

import asyncio
import json
from pathlib import Path

import pytest

from continuum_lab.bench import replay as replay_module
from continuum_lab.bench.replay import ProgramRecord, Replayer, ReplayResult, TurnRecord
from continuum_lab.bench.rollout_report import aggregate, markdown, step_figures
from continuum_lab.workloads.rollout import parse_shape, rollout_step
from continuum_lab.workloads.schema import Program, Turn, WorkloadError, dump_workload, load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "configs" / "profiles" / "h100-sglang-llama-3.1-8b.json"


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_shape_is_prompts_x_samples():
    assert parse_shape("32x8") == (32, 8) and parse_shape(" 2X3 ") == (2, 3)
    for bad in ("32", "0x8", "8x0", "axb", "3x4x5"):
        with pytest.raises(ValueError):
            parse_shape(bad)


def test_a_steps_groups_share_their_first_prompt_and_each_sample_is_its_own_after_it():
    step = rollout_step(3, 4, seed=7, token_scale=0.05)
    assert len(step) == 12 and len({p.program_id for p in step}) == 12
    groups = [step[g * 4 : (g + 1) * 4] for g in range(3)]  # group by group, as a framework submits
    for members in groups:
        assert len({p.group for p in members}) == 1
        assert len({p.turns[0].append_tokens for p in members}) == 1  # one system + task prompt
        # after it, every sample draws its own trajectory: outputs, tools, tool times, later turns
        rests = [[(t.output_tokens, t.tool, t.tool_duration_s, t.append_tokens) for t in p.turns[1:]] for p in members]
        firsts = [(p.turns[0].output_tokens, p.turns[0].tool, p.turns[0].tool_duration_s) for p in members]
        assert len({tuple(r) for r in rests}) == 4 and len(set(firsts)) > 1
    assert len({members[0].group for members in groups}) == 3
    assert all(p.turns[-1].tool is None and p.turns[-1].tool_duration_s == 0 for p in step)


def test_a_step_is_seeded_and_deterministic(tmp_path):
    a, b = rollout_step(2, 3, seed=1), rollout_step(2, 3, seed=1)
    assert a == b and a != rollout_step(2, 3, seed=2)
    assert load_workload(dump_workload(a, tmp_path / "step.jsonl")) == a  # the group survives the file


def test_a_workload_refuses_a_group_whose_first_prompts_differ():
    line = lambda pid, n: json.dumps(
        {"program_id": pid, "group": "g", "turns": [{"append_tokens": n, "output_tokens": 1}]}
    )
    assert len(parse_workload([line("a", 5), line("b", 5)])) == 2
    with pytest.raises(WorkloadError, match="group 'g' shares one first prompt of 5 tokens, not 6"):
        parse_workload([line("a", 5), line("b", 6)], "w.jsonl")


def _replayed_prompts(programs, monkeypatch, outputs) -> dict[str, list[list[int]]]:
    """Every turn's prompt ids the replay client sends (no server: ``_send`` answers)."""
    sent: dict[str, list[list[int]]] = {}

    async def fake_send(self, client, rec, path, body, headers):
        sent.setdefault(rec.program_id, []).append(list(body["input_ids"]))
        assert body["sampling_params"]["temperature"] == 1.0
        return outputs(rec)

    monkeypatch.setattr(Replayer, "_send", fake_send)
    replayer = Replayer("http://unused", seed=3, vocab=500, temperature=1.0)

    async def all_of_them():
        await asyncio.gather(*(replayer._program(None, p, ProgramRecord(p.program_id, 0.0)) for p in programs))

    asyncio.run(all_of_them())
    return sent


def _no_tools(programs):
    return [
        p.model_copy(update={"turns": [t.model_copy(update={"tool_duration_s": 0.0}) for t in p.turns]})
        for p in programs
    ]


def test_the_replay_client_sends_a_groups_first_prompt_token_for_token(monkeypatch):
    step = _no_tools(rollout_step(2, 2, seed=5, token_scale=0.02))
    turns = {p.program_id: p.turns for p in step}
    # even with identical outputs (greedy), the samples' next prompts part at their own appends
    same = lambda rec: [9] * turns[rec.program_id][rec.turn].output_tokens
    sent = _replayed_prompts(step, monkeypatch, same)
    a, b, c, _ = (sent[p.program_id] for p in step)
    prompt = step[0].turns[0].append_tokens
    assert a[0] == b[0] and len(a[0]) == prompt and a[0] != c[0]
    assert prompt <= _common_prefix(a[1], b[1]) < min(len(a[1]), len(b[1]))
    # sampled outputs (a rollout's temperature) part them right after the shared prompt
    token = {p.program_id: 10 + i for i, p in enumerate(step)}
    own = lambda rec: [token[rec.program_id]] * turns[rec.program_id][rec.turn].output_tokens
    sampled = _replayed_prompts(step[:2], monkeypatch, own)
    assert _common_prefix(*(sampled[p.program_id][1] for p in step[:2])) == prompt
    # an ungrouped program draws its first prompt as before: its own generator's
    alone = step[0].model_copy(update={"group": None, "program_id": "solo"})
    turns["solo"] = alone.turns
    assert _replayed_prompts([alone], monkeypatch, same)["solo"][0] != a[0]


def test_the_emulators_samples_share_the_first_prompt_and_part_at_their_first_output(monkeypatch):
    from continuum_lab.emulator import driver as driver_module
    from continuum_lab.emulator.sglang_engine import output_token
    from sglang_continuum.core.clock import ManualClock

    step = rollout_step(2, 3, seed=5, token_scale=0.02)
    submitted = {}
    monkeypatch.setattr(driver_module.engine, "submit", lambda s, rid, ids, *a: submitted.setdefault(rid, list(ids)))
    driver = driver_module.ClosedLoopDriver(None, None, ManualClock(0.0), seed=4, vocab=1000)
    for p in step:
        driver._start(p, 0.0)
    for state in driver._states:  # the first turns, then each answered with its own output tokens
        driver._send(state, 0.0)
        rid = f"{state.spec.program_id}#0"
        state.context.extend([output_token(rid)] * state.spec.turns[0].output_tokens)
        state.next_turn = 1
        driver._send(state, 1.0)
    firsts = [submitted[f"{p.program_id}#0"] for p in step]
    seconds = [submitted[f"{p.program_id}#1"] for p in step]
    prompt = step[0].turns[0].append_tokens
    assert firsts[0] == firsts[1] == firsts[2] != firsts[3] and len(firsts[0]) == prompt
    assert _common_prefix(seconds[0], seconds[1]) == _common_prefix(seconds[1], seconds[2]) == prompt


def _record(pid, sends, finishes, *, error=None, prompt=100, cached=40, output=10):
    turns = [
        TurnRecord(pid, i, send=s, first_token=f, finish=f, prompt_tokens=prompt, cached_tokens=cached,
                   output_tokens=output, error=error if i == len(sends) - 1 else None)
        for i, (s, f) in enumerate(zip(sends, finishes))
    ]  # fmt: skip
    ended = turns and turns[-1].finish is not None and error is None
    return ProgramRecord(pid, 0.0, start=0.0, end=turns[-1].finish if ended else None, turns=turns)


def test_the_makespan_is_the_last_programs_end_and_a_cut_off_program_counts_until_the_limit():
    done = ReplayResult([_record("a", [0.0, 2.0], [1.0, 3.0]), _record("b", [0.0, 5.0], [4.0, 9.0])], wall_s=9.0)
    f = step_figures(done)
    assert f["makespan_s"] == 9.0 and f["jct_mean_s"] == 6.0 and f["finished"] == 2 and not f["time_limit_hit"]
    assert f["output_tokens_per_s"] == pytest.approx(40 / 9.0) and f["cache_hit"] == pytest.approx(0.4)
    cut = ReplayResult(
        [_record("a", [0.0], [1.0]), _record("b", [0.0, 5.0], [4.0, None]), _record("c", [0.0], [2.0], error="x")],
        wall_s=30.0,
    )
    f = step_figures(cut)
    assert (f["finished"], f["unfinished"], f["failed"], f["time_limit_hit"]) == (1, 1, 1, True)
    assert f["makespan_s"] == 30.0 and f["jct_mean_s"] == pytest.approx((1 + 30 + 2) / 3)
    assert f["output_tokens"] == 20  # finished turns only


def test_the_report_gives_the_makespan_against_the_best_stock_policy_on_each_seed():
    spans = {("fcfs", 1): 100.0, ("fcfs", 2): 120.0, ("lpm", 1): 90.0, ("lpm", 2): 100.0,
             ("continuum", 1): 60.0, ("continuum", 2): 80.0}  # fmt: skip
    runs = [
        {"policy": p, "seed": s, "figures": step_figures(ReplayResult([_record(p, [0.0], [m])], wall_s=m))}
        for (p, s), m in spans.items()
    ]
    rows = {r["policy"]: r for r in aggregate(runs)}
    c = rows["continuum"]
    assert c["best_stock"] == "lpm" and c["makespan_s"] == 70.0 and c["makespan_worst_s"] == 80.0
    assert c["vs_best_stock_median"] == pytest.approx((1.5 + 1.25) / 2) and c["vs_best_stock_worst"] == 1.25
    assert rows["lpm"]["vs_best_stock_median"] is None  # stock rows are the reference
    table = markdown(list(rows.values()))
    for column in ("makespan s (worst seed)", "mean JCT s", "p90 JCT s", "output tok/s", "cached", "vs best stock"):
        assert column in table
    assert "1.38x (1.25x) vs lpm" in table


def test_the_replay_client_stops_a_step_at_its_time_limit(monkeypatch):
    async def fake_send(self, client, rec, path, body, headers):
        return [9] * 2

    async def no_metrics(client, url):
        return ""

    monkeypatch.setattr(Replayer, "_send", fake_send)
    monkeypatch.setattr(replay_module, "_metrics", no_metrics)
    quick = Program(program_id="quick", turns=[Turn(append_tokens=4, output_tokens=2)])
    slow = Program(program_id="slow", turns=[Turn(append_tokens=4, output_tokens=2, tool="t", tool_duration_s=30.0),
                                             Turn(append_tokens=4, output_tokens=2)])  # fmt: skip
    result = asyncio.run(Replayer("http://unused").run([quick, slow], 0.0, until=0.3))
    q, s = result.programs
    assert q.start == pytest.approx(0.0, abs=0.05) and s.start == pytest.approx(0.0, abs=0.05)  # released at once
    assert q.ok and not s.ok and len(s.turns) == 1
    f = step_figures(result)
    # asyncio may fire a timer up to its clock's resolution early (0.29988 s seen under load)
    assert f["time_limit_hit"] and f["makespan_s"] == result.wall_s >= 0.29


@pytest.mark.parametrize(
    "argv",
    [
        ["--rollout", "2x"],
        ["--rollout", "2x2", "--workload", "workloads/swe-cpu.jsonl"],
        ["--rollout", "2x2", "--sessions", "4"],
        ["--rollout", "2x2", "--jps", "1"],
        ["--rollout", "2x2", "--rollout-limit-s", "0"],
        ["--policies", "fcfs"],  # neither --workload nor --rollout
    ],
)
def test_bench_cli_refuses(argv, tmp_path):
    from continuum_lab.cli.bench import main

    with pytest.raises(SystemExit) as exc:
        main([*argv, "--emulate", str(PROFILE), "--out", str(tmp_path)])
    assert exc.value.code == 2


@pytest.mark.sglang
def test_an_emulated_rollout_releases_every_program_at_once_and_finishes_each(tmp_path):
    """The smallest step, emulated (SGLang's scheduler, each run a process forked from one that
    imported SGLang): ~30 s on 2 cores."""
    from continuum_lab.cli.bench import main

    out = tmp_path / "rollout"
    rc = main(
        [
            "--rollout", "2x2", "--rollout-token-scale", "0.05", "--emulate", str(PROFILE),
            "--policies", "fcfs,continuum", "--seeds", "1", "--max-total-tokens", "20000", "--out", str(out),
            "--client-timeout-s", "900", "--client-retries", "1",
        ]
    )  # fmt: skip
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert (report["rollout"]["client_timeout_s"], report["rollout"]["client_retries"]) == (900.0, 1)
    assert [r["policy"] for r in report["rows"]] == ["fcfs", "continuum"]
    for policy in ("fcfs", "continuum"):
        run = json.loads((out / "runs" / f"{policy}-rollout2x2-s1-r0.json").read_text())
        programs = run["replay"]["programs"]
        assert (run["replay"]["client_timeout_s"], run["replay"]["client_retries"]) == (900.0, 1)  # the run's clients
        assert len(programs) == 4 and all(p["ok"] for p in programs)
        assert all(p["turns"][0]["send"] == 0.0 for p in programs)  # the closed batch: all at t = 0
        figures = next(r["figures"] for r in report["runs"] if r["policy"] == policy)
        assert figures["makespan_s"] == max(p["end"] for p in programs) == run["replay"]["wall_s"]
        assert figures["finished"] == 4 and not figures["time_limit_hit"]
    md = (out / "report.md").read_text()
    assert md.startswith("# continuum-bench --rollout 2x2\n\nCommand: `continuum-bench --rollout 2x2")
    assert "**Emulated, predictions**" in md
    for column in ("makespan s (worst seed)", "mean JCT s", "p90 JCT s", "output tok/s", "cached", "vs best stock"):
        assert column in md
