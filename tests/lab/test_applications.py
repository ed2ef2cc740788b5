"""Multi-agent applications (``workloads/applications.py``, ``workloads/multi_agent.py``) and their
bench (``bench/applications.py``, ``bench/applications_report.py``): the DAG a file may hold, the
critical path, the generators' shapes, when an agent starts, the hints and the figures."""

import asyncio
import heapq
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_lab.bench import replay as replay_module
from continuum_lab.bench.applications import AgentStarts, application_figures, replay_applications
from continuum_lab.bench.applications_report import aggregate, markdown
from continuum_lab.bench.replay import ProgramRecord, Replayer, ReplayResult, arrival_times, hinted
from continuum_lab.workloads.applications import (
    Application,
    critical_agents,
    longest_path,
    parse_applications,
    tool_bound_s,
    topological_order,
)
from continuum_lab.workloads.multi_agent import STANDARD, generate_applications
from continuum_lab.workloads.schema import WorkloadError

ROOT = Path(__file__).resolve().parents[2]


def _turns(*tools: float, out: int = 4) -> list[dict]:
    """A turn per tool time (the tool ``t``), then a last turn with no tool."""
    body = [{"append_tokens": 8, "output_tokens": out, "tool": "t", "tool_duration_s": s} for s in tools]
    return [*body, {"append_tokens": 4, "output_tokens": out}]


def _app(edges: dict[str, list[str]], tools: dict[str, tuple] | None = None, app_id: str = "a") -> dict:
    tools = tools or {}
    return {
        "app_id": app_id,
        "kind": "test",
        "agents": [
            {
                "agent_id": a,
                "agent_type": a.rstrip("0123456789"),
                "depends_on": deps,
                "turns": _turns(*tools.get(a, ())),
            }
            for a, deps in edges.items()
        ],
    }


def _parse(*apps: dict) -> list[Application]:
    return parse_applications([orjson.dumps(a) for a in apps], "apps.jsonl")


DIAMOND = {"plan": [], "long": ["plan"], "short": ["plan"], "join": ["long", "short"]}


def test_a_valid_file_parses_and_its_agents_are_programs_named_by_app_and_agent():
    (app,) = _parse(_app(DIAMOND))
    assert [a.agent_id for a in topological_order(app)] == ["plan", "long", "short", "join"]
    assert app.program(app.agents[3]).program_id == "a/join"


@pytest.mark.parametrize(
    "edges, problem",
    [
        ({"x": ["y"], "y": ["x"]}, "cycle"),
        ({"x": ["x"]}, "cycle"),
        ({"x": [], "y": ["nobody"]}, "unknown agents"),
        ({"x": [], "y": ["x", "x"]}, "names a dependency twice"),
    ],
)
def test_a_file_that_is_not_a_dag_is_refused_with_its_line(edges, problem):
    with pytest.raises(WorkloadError, match=rf"apps.jsonl:1: .*{problem}"):
        _parse(_app(edges))


def test_duplicate_agents_apps_and_a_last_turn_that_calls_a_tool_are_refused():
    twice = _app({"x": []})
    twice["agents"] *= 2
    with pytest.raises(WorkloadError, match="duplicate agent_id"):
        _parse(twice)
    with pytest.raises(WorkloadError, match="apps.jsonl:2: duplicate app_id 'a'"):
        _parse(_app({"x": []}), _app({"y": []}))
    calls = _app({"x": []})
    calls["agents"][0]["turns"][-1]["tool"] = "t"
    with pytest.raises(WorkloadError, match="the last turn calls no tool"):
        _parse(calls)
    slash = _app({"x/y": []})
    with pytest.raises(WorkloadError, match="agent_id"):
        _parse(slash)


def test_the_critical_path_is_the_longest_path_by_expected_duration():
    (app,) = _parse(_app(DIAMOND, {"long": (5.0, 5.0), "short": (0.5,)}))
    assert critical_agents(app) == {"plan", "long", "join"}
    assert tool_bound_s(app) == pytest.approx(10.0)
    (tie,) = _parse(_app(DIAMOND, {"long": (2.0,), "short": (2.0,)}))
    assert critical_agents(tie) == {"plan", "long", "short", "join"}  # every longest path counts


@st.composite
def dags(draw):
    """A random DAG (edges from a lower index to a higher one) with random tool times."""
    n = draw(st.integers(1, 8))
    edges = {
        f"n{i}": sorted({f"n{j}" for j in draw(st.sets(st.integers(0, max(0, i - 1))))} if i else []) for i in range(n)
    }
    tools = {a: tuple(draw(st.lists(st.sampled_from([0.1, 0.5, 1.0, 3.0]), max_size=3))) for a in edges}
    return _app(edges, tools)


def _paths(app: Application) -> list[list[str]]:
    """Every path from an agent with no dependencies to one nothing depends on."""
    dependents = {a.agent_id: [b.agent_id for b in app.agents if a.agent_id in b.depends_on] for a in app.agents}
    out, todo = [], [[a.agent_id] for a in app.agents if not a.depends_on]
    while todo:
        path = todo.pop()
        nxt = dependents[path[-1]]
        out += [path] if not nxt else []
        todo += [[*path, n] for n in nxt]
    return out


@given(dags())
def test_every_dag_parses_in_an_order_that_respects_it_and_its_critical_agents_are_those_on_a_longest_path(data):
    (app,) = _parse(data)
    order = [a.agent_id for a in topological_order(app)]
    for a in app.agents:
        assert all(order.index(d) < order.index(a.agent_id) for d in a.depends_on)
    weight = {a.agent_id: a.tool_s + 1.0 for a in app.agents}
    lengths = [(sum(weight[n] for n in path), path) for path in _paths(app)]  # brute force
    best = max(length for length, _ in lengths)
    length, on = longest_path(app, lambda a: weight[a.agent_id])
    assert length == pytest.approx(best)
    assert on == {n for total, path in lengths if total == pytest.approx(best) for n in path}
    assert tool_bound_s(app) == pytest.approx(max(sum(weight[n] - 1.0 for n in path) for path in _paths(app)))


@given(dags(), st.data())
def test_an_edge_back_up_the_order_is_a_cycle(data, draw):
    if len(data["agents"]) < 2:
        return
    agents = data["agents"]
    i = draw.draw(st.integers(1, len(agents) - 1))
    j = draw.draw(st.integers(0, i - 1))
    agents[j]["depends_on"] = sorted({*agents[j]["depends_on"], agents[i]["agent_id"]})
    reaches = {a["agent_id"]: set(a["depends_on"]) for a in agents}  # does i reach j through its deps?
    seen, todo = set(), [agents[i]["agent_id"]]
    while todo:
        node = todo.pop()
        seen.add(node)
        todo += [d for d in reaches[node] if d not in seen]
    if agents[j]["agent_id"] in seen:
        with pytest.raises(WorkloadError, match="cycle"):
            _parse(data)
    else:
        _parse(data)  # an edge that closes no cycle keeps it a DAG


def test_code_writer_is_a_planner_parallel_programmers_a_reviewer_and_a_tester_with_short_file_tools():
    apps = generate_applications("code-writer", 6, seed=3)
    assert apps == generate_applications("code-writer", 6, seed=3)  # seeded
    assert apps != generate_applications("code-writer", 6, seed=4)
    for app in apps:
        deps = {a.agent_id: a.depends_on for a in app.agents}
        programmers = [a for a in deps if a.startswith("programmer")]
        assert 3 <= len(programmers) <= 6 and deps["planner"] == []
        assert all(deps[p] == ["planner"] for p in programmers)
        assert deps["reviewer"] == programmers and deps["tester"] == ["reviewer"]
        tools = [t.tool_duration_s for a in app.agents for t in a.turns[:-1]]
        assert all(0.1 <= s <= 2.0 for s in tools)
        assert "programmer-0" in critical_agents(app) or any(p in critical_agents(app) for p in programmers)
        assert {"planner", "reviewer", "tester"} <= critical_agents(app)


def test_deep_research_has_searchers_feeding_analysts_and_long_search_tools():
    for app in generate_applications("deep-research", 8, seed=1):
        deps = {a.agent_id: set(a.depends_on) for a in app.agents}
        searchers = {a for a in deps if a.startswith("searcher")}
        analysts = {a for a in deps if a.startswith("analyst")}
        assert 3 <= len(searchers) <= 5 and 2 <= len(analysts) <= 3
        assert all(deps[s] == {"planner"} for s in searchers)
        assert all(deps[a] and deps[a] <= searchers for a in analysts)
        assert searchers == set().union(*(deps[a] for a in analysts))  # every finding reaches an analyst
        assert analysts <= deps["summarizer"] and deps["writer"] == {"summarizer", "planner"}
        searches = [t.tool_duration_s for a in app.agents if a.agent_type == "searcher" for t in a.turns[:-1]]
        assert min(searches) >= 1.0 and max(searches) <= 8.0


def test_token_scale_sizes_the_cpu_variant_and_the_committed_files_are_what_the_generator_writes():
    small = generate_applications("code-writer", 4, seed=0, token_scale=0.05)
    contexts = [sum(t.append_tokens + t.output_tokens for t in a.turns) for app in small for a in app.agents]
    assert max(contexts) < 1500 and sum(contexts) / len(contexts) < 600  # a few hundred tokens
    for name, kind, n, scale in STANDARD:
        path = ROOT / "workloads" / "multi-agent" / name
        assert path.stat().st_size < 200_000
        committed = parse_applications(path.read_bytes().splitlines(), name)
        assert committed == generate_applications(kind, n, seed=0, token_scale=scale)


def _simulate(starts: AgentStarts, duration: dict[str, float]) -> dict[str, tuple[float, float]]:
    """A fake clock: every agent runs ``duration`` once started; -> program id: (start, end)."""
    events = [(at, 0, p.program_id) for at, p in starts.roots()]
    heapq.heapify(events)
    seq, out = 1, {}
    while events:
        at, _, pid = heapq.heappop(events)
        out[pid] = (at, at + duration[pid])
        heapq.heappush(events, (at + duration[pid], seq, "end:" + pid))
        seq += 1
        while events and events[0][2].startswith("end:"):
            end, _, done = heapq.heappop(events)
            for ready in starts.ended(done[4:]):
                heapq.heappush(events, (end, seq, ready.program_id))
                seq += 1
    return out


def test_an_agent_starts_when_its_last_dependency_ends_and_roots_at_their_applications_arrival():
    apps = _parse(_app(DIAMOND, {"long": (3.0,)}, app_id="x"), _app({"solo": [], "after": ["solo"]}, app_id="y"))
    starts = AgentStarts(apps, aps=2.0, seed=5)
    assert starts.arrivals == arrival_times(2, 2.0, 5)
    duration = {"x/plan": 1.0, "x/long": 4.0, "x/short": 1.0, "x/join": 1.0, "y/solo": 2.0, "y/after": 0.5}
    ran = _simulate(starts, duration)
    assert set(ran) == set(duration)  # every agent started
    x, y = starts.arrivals
    assert ran["x/plan"][0] == x and ran["y/solo"][0] == y
    assert ran["x/long"][0] == ran["x/short"][0] == ran["x/plan"][1]
    assert ran["x/join"][0] == max(ran["x/long"][1], ran["x/short"][1]) == x + 5.0
    assert ran["y/after"][0] == ran["y/solo"][1]
    assert starts.hints["x/long"] == {"app_id": "x", "critical": True}
    assert starts.hints["x/short"]["critical"] is False


def test_hints_travel_only_when_asked_and_a_tool_time_only_on_a_turn_that_calls_a_tool():
    (app,) = _parse(_app({"a": []}, {"a": (1.5,)}))
    program = app.program(app.agents[0])
    hints = {program.program_id: {"app_id": "a", "critical": True}}
    assert hinted(None, program, 0) == {} and hinted({}, program, 0) == {}
    assert hinted(hints, program, 0) == {"app_id": "a", "critical": True, "tool_time_s": 1.5}
    assert hinted(hints, program, 1) == {"app_id": "a", "critical": True}  # the last turn calls none
    replayer = Replayer("http://unused")
    plain = replayer._body(program, 0, [5])[1]["sampling_params"]["custom_params"]
    replayer.hints = hints
    sent = replayer._body(program, 0, [5])[1]["sampling_params"]["custom_params"]
    assert not {"app_id", "critical", "tool_time_s"} & set(plain)
    assert sent["app_id"] == "a" and sent["critical"] is True and sent["tool_time_s"] == 1.5


def test_sessions_with_hints_send_every_turns_tool_time_and_nothing_else():
    """``--sessions --hints``: no application, so every program's turns carry their (capped) tool
    time as the forecast, and no ``app_id`` or ``critical``."""
    from continuum_lab.bench.sessions import session_programs

    (app,) = _parse(_app({"a": []}, {"a": (30.0,)}))
    program = next(session_programs([app.program(app.agents[0])], seed=1, max_gap_s=10.0))
    assert hinted(None, program, 0, tool_times=True) == {"tool_time_s": 10.0}
    assert hinted(None, program, 1, tool_times=True) == {}
    replayer = Replayer("http://unused")
    replayer.tool_times = True
    sent = replayer._body(program, 0, [5])[1]["sampling_params"]["custom_params"]
    assert sent["tool_time_s"] == 10.0 and not {"app_id", "critical"} & set(sent)


def test_the_replay_client_starts_each_agent_after_its_dependencies(monkeypatch):
    async def fake_send(self, client, rec, path, body, headers):
        await asyncio.sleep(0.01)
        return [9] * body["sampling_params"]["max_new_tokens"]

    async def no_metrics(client, url):
        return ""

    monkeypatch.setattr(Replayer, "_send", fake_send)
    monkeypatch.setattr(replay_module, "_metrics", no_metrics)
    apps = _parse(_app(DIAMOND, {"long": (0.05,)}))
    result = asyncio.run(replay_applications(Replayer("http://unused", seed=1), apps, 100.0, hints=True))
    rec = {p.program_id: p for p in result.programs}
    assert len(rec) == 4 and all(r.ok for r in rec.values())
    assert rec["a/long"].start >= rec["a/plan"].end and rec["a/short"].start >= rec["a/plan"].end
    assert rec["a/join"].start >= max(rec["a/long"].end, rec["a/short"].end)
    f = application_figures(result, apps, 100.0, 1)
    assert f["finished_apps"] == 1 and f["app_latency_mean_s"] >= tool_bound_s(apps[0]) == 0.05


def _record(pid: str, start: float, end: float) -> ProgramRecord:
    return ProgramRecord(pid, start, start=start, end=end)


def test_abnormal_agents_are_over_one_and_a_half_times_their_types_mean_and_app_latency_ends_with_the_last():
    apps = _parse(_app({"w0": [], "w1": [], "w2": [], "w3": [], "boss": ["w0", "w1", "w2", "w3"]}))
    records = [_record("a/w0", 0, 1), _record("a/w1", 0, 1), _record("a/w2", 0, 1), _record("a/w3", 0, 4)]
    records.append(_record("a/boss", 4, 6))
    at = arrival_times(1, 1.0, 0)[0]
    f = application_figures(ReplayResult(records, 6.0), apps, 1.0, 0, kv=[[0, 0.2, 0.5], [1, 0.4, 0.6]])
    assert f["abnormal_agents"] == 1 and f["abnormal_share"] == pytest.approx(1 / 5)  # w3: 4 > 1.5 x 1.75
    assert f["abnormal_by_type"]["w"] == {"agents": 4, "abnormal": 1, "mean_s": 1.75}
    assert f["app_latency_mean_s"] == 6.0 - at and f["failed_apps"] == 0
    assert f["kv_used_mean"] == pytest.approx(0.3) and f["kv_occupied_mean"] == pytest.approx(0.55)
    records[-1].end = None  # the last agent failed: its application did not finish
    failed = application_figures(ReplayResult(records, 6.0), apps, 1.0, 0)
    assert failed["finished_apps"] == 0 and failed["app_latency_mean_s"] is None


def test_the_report_gives_median_spread_and_worst_seed_and_the_ratio_against_fcfs():
    def rec(policy, seed, latency):
        return {
            "policy": policy,
            "aps": 0.5,
            "seed": seed,
            "figures": {"app_latency_mean_s": latency, "failed_apps": 0},
        }

    records = [rec("fcfs", 1, 10.0), rec("continuum", 1, 5.0), rec("fcfs", 2, 12.0), rec("continuum", 2, 8.0)]
    records += [rec("fcfs", 3, 11.0), rec("continuum", 3, 11.0)]
    rows = {r["policy"]: r for r in aggregate(records)}
    c = rows["continuum"]
    assert c["app_latency_mean_s"] == 8.0 and c["worst_seed"] == 3 and c["app_latency_worst_s"] == 11.0
    assert c["app_latency_iqr_s"] == pytest.approx(3.0)
    assert c["vs_fcfs"] == pytest.approx(1.5) and c["vs_fcfs_worst"] == pytest.approx(1.0)
    assert "8.0 | 3.0 | 11.0 (seed 3)" in markdown(list(rows.values()))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--workload", "w.jsonl"], "excludes --workload"),
        (["--jps", "1"], "excludes --jps"),
        (["--aps", "0"], "positive rates"),
        ([], "needs --emulate"),
    ],
)
def test_the_bench_refuses_what_applications_exclude(tmp_path, capsys, extra, message):
    from continuum_lab.cli.bench import main

    path = tmp_path / "apps.jsonl"
    path.write_bytes(orjson.dumps(_app({"x": []})) + b"\n")
    with pytest.raises(SystemExit):
        main(["--applications", str(path), *extra, "--out", str(tmp_path / "out")])
    assert message in capsys.readouterr().err
