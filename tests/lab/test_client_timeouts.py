"""Clients that give up (``bench/replay.py``): a try with no first token within the client timeout
is cancelled and the turn resent, up to the retries; a turn that times out on every try fails its
program. The replay client against an in-process stand-in for SGLang's /generate stream, and the
figures every report draws from the records."""

import asyncio

import httpx
import orjson
import pytest

from continuum_lab.bench import replay as replay_module
from continuum_lab.bench.replay import TIMEOUT_ERROR, ProgramRecord, Replayer, ReplayResult, TurnRecord
from continuum_lab.bench.report import markdown_table, summarize
from continuum_lab.bench.rollout_report import aggregate as rollout_aggregate
from continuum_lab.bench.rollout_report import markdown as rollout_markdown
from continuum_lab.bench.rollout_report import step_figures
from continuum_lab.bench.sessions import SessionsProtocol, window_figures
from continuum_lab.bench.sessions_report import aggregate, markdown
from continuum_lab.workloads.schema import Program, Turn

TIMEOUT_S = 0.2


class _Stream(httpx.AsyncByteStream):
    """A /generate stream whose first chunk comes ``delay`` seconds after the request."""

    def __init__(self, server: "_Server", delay: float, body: dict) -> None:
        self.server, self.delay, self.body = server, delay, body
        self.answered = False

    async def __aiter__(self):
        await asyncio.sleep(self.delay)
        n = self.body["sampling_params"]["max_new_tokens"]
        meta = {"prompt_tokens": len(self.body["input_ids"]), "completion_tokens": n, "queue_time": 0.01}
        self.answered = True
        yield b"data: " + orjson.dumps({"meta_info": meta, "output_ids": [7] * n}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        if not self.answered:  # closed before the first token: a client's disconnect, which SGLang aborts
            self.server.disconnected.append(self.body.get("rid"))


class _Server:
    """The k-th request's first token comes ``delays[k]`` seconds after it (then at once)."""

    def __init__(self, *delays: float) -> None:
        self.delays = list(delays)
        self.rids: list = []
        self.disconnected: list = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/generate":
            return httpx.Response(404)
        body = orjson.loads(request.content)
        self.rids.append(body.get("rid"))
        return httpx.Response(200, stream=_Stream(self, self.delays.pop(0) if self.delays else 0.0, body))


def _replay(server: _Server, programs, monkeypatch, *, timeout_s=TIMEOUT_S, sessions_until=None, **kw):
    monkeypatch.setattr(replay_module, "REST_S", 0.0)  # nothing to wait for after the run
    replayer = Replayer("http://fake", client_timeout_s=timeout_s, client_retries=2,
                        transport=httpx.MockTransport(server), **kw)  # fmt: skip
    if sessions_until is None:
        return asyncio.run(replayer.run(programs, 0.0))
    return asyncio.run(replayer.run_sessions(iter(programs), 1, [0.0], sessions_until))


def _program(name: str, turns: int = 1, gap: float = 0.0) -> Program:
    tools = [Turn(append_tokens=4, output_tokens=2, tool="t", tool_duration_s=gap) for _ in range(turns - 1)]
    return Program(program_id=name, turns=[*tools, Turn(append_tokens=4, output_tokens=2)])


def test_a_try_without_a_first_token_in_time_is_dropped_and_the_turn_resent_under_a_new_rid(monkeypatch):
    server = _Server(10.0, 10.0, 0.0)  # the first two tries would wait 10 s, the third answers at once
    result = _replay(server, [_program("p")], monkeypatch, identity="none")
    (turn,) = result.programs[0].turns
    assert result.programs[0].ok and turn.error is None
    assert (turn.timeouts, turn.retries, turn.output_tokens) == (2, 2, 2)
    assert server.rids == ["p#0", "p~r1#0", "p~r2#0"] and server.disconnected == ["p#0", "p~r1#0"]
    # what the user waited: from the first try's send, through both timeouts
    assert turn.ttft >= 2 * TIMEOUT_S and turn.queue_time_s == pytest.approx(turn.ttft, abs=0.05)
    assert (result.client_timeout_s, result.client_retries) == (TIMEOUT_S, 2)


def test_a_turn_that_times_out_on_every_try_fails_its_program_and_the_next_session_replaces_it(monkeypatch):
    server = _Server(10.0, 10.0, 10.0)  # the first session's first turn never answers in time
    sessions = [_program("stuck", turns=2), _program("next", turns=2, gap=0.3), _program("after")]
    result = _replay(server, sessions, monkeypatch, sessions_until=1.0)
    stuck, following = result.programs[0], result.programs[1]
    assert len(stuck.turns) == 1 and stuck.turns[0].error.startswith(TIMEOUT_ERROR)
    assert not stuck.ok and stuck.timed_out and (stuck.turns[0].timeouts, stuck.turns[0].retries) == (3, 2)
    assert len(server.disconnected) == 3  # every try's connection closed
    assert following.program_id == "next" and following.planned_arrival == pytest.approx(3 * TIMEOUT_S, abs=0.05)
    summary = summarize(result)
    assert (summary["timeouts"], summary["retries"], summary["timed_out_programs"]) == (3, 2, 1)
    assert summary["failed_programs"] == 1 and summary["failed_requests"] == 1
    assert "| timeouts | retries | failed | failed programs |" in markdown_table(
        [{"policy": "x", "jps": 1.0} | summary]
    )


def test_a_zero_timeout_waits_for_a_slow_first_token_as_before(monkeypatch):
    server = _Server(2 * TIMEOUT_S)
    result = _replay(server, [_program("p")], monkeypatch, timeout_s=0.0)
    (turn,) = result.programs[0].turns
    assert result.programs[0].ok and (turn.timeouts, turn.retries) == (0, 0) and turn.ttft >= 2 * TIMEOUT_S
    assert server.disconnected == [] and result.client_timeout_s == 0.0


def test_the_records_round_trip_with_the_clients_and_old_records_still_load():
    turns = [TurnRecord("p", 0, send=0.0, finish=3.0, timeouts=3, retries=2, error=f"{TIMEOUT_ERROR}: x")]
    result = ReplayResult(
        [ProgramRecord("p", 0.0, start=0.0, turns=turns)], 3.0, client_timeout_s=1.0, client_retries=2
    )
    data = result.to_dict()
    assert data["programs"][0]["timed_out"] and data["programs"][0]["turns"][0]["timeouts"] == 3
    back = ReplayResult.from_dict(data)
    assert back.programs == result.programs and (back.client_timeout_s, back.client_retries) == (1.0, 2)
    old = {**data, "programs": [{**data["programs"][0], "turns": [{**data["programs"][0]["turns"][0]}]}]}
    for key in ("client_timeout_s", "client_retries"):
        del old[key]
    for key in ("timeouts", "retries"):
        del old["programs"][0]["turns"][0][key]
    del old["programs"][0]["timed_out"]
    before = ReplayResult.from_dict(old)  # a run from before clients gave up: they waited forever
    assert (before.client_timeout_s, before.client_retries) == (0.0, 0) and before.programs[0].turns[0].timeouts == 0


def _turn(pid, i, send, first, finish, out=10, queue=None, **kw):
    return TurnRecord(pid, i, send=send, first_token=first, finish=finish, prompt_tokens=100, output_tokens=out,
                      queue_time_s=queue, **kw)  # fmt: skip


def _window_run() -> ReplayResult:
    """In a window [10, 110): a turn answered on its second try; a program whose second turn timed
    out on every try (one of them produced tokens: not the client's), the session that replaced
    it, and one whose first turn timed out on every try."""
    timed_out = {"timeouts": 3, "retries": 2, "error": f"{TIMEOUT_ERROR}: 3 tries"}
    a = ProgramRecord("a", 20.0, start=20.0, end=55.0,
                      turns=[_turn("a", 0, 20.0, 50.0, 55.0, queue=29.0, timeouts=1, retries=1)])  # fmt: skip
    b = ProgramRecord("b", 30.0, start=30.0, turns=[
        _turn("b", 0, 30.0, 31.0, 32.0, out=3, queue=1.0), _turn("b", 1, 35.0, None, 75.0, out=7, **timed_out)
    ])  # fmt: skip
    c = ProgramRecord("c", 75.0, start=75.0, end=77.0, turns=[_turn("c", 0, 75.0, 76.0, 77.0, out=5, queue=1.0)])
    d = ProgramRecord("d", 80.0, start=80.0, turns=[_turn("d", 0, 80.0, None, 100.0, out=0, **timed_out)])
    return ReplayResult([a, b, c, d], 110.0, client_timeout_s=40.0 / 3, client_retries=2)


def test_window_figures_count_the_timeouts_and_only_the_answered_tries_tokens():
    protocol = SessionsProtocol(concurrency=2, window_s=100.0, warmup_s=10.0, client_timeout_s=40.0 / 3)
    f = window_figures(_window_run(), protocol)
    assert (f["timeouts"], f["retries"], f["failed_programs"]) == (7, 5, 2)
    assert f["output_tokens_per_s"] == pytest.approx((10 + 3 + 5) / 100.0)  # not b's 7
    # b's return waited until its client gave up (75 s), not until the window's end; d is not waiting there
    assert f["ttft_max_s"] == pytest.approx(40.0) and f["longest_later_turn_wait_s"] == pytest.approx(40.0)
    assert f["longest_first_turn_wait_s"] == pytest.approx(29.0) and f["first_turns_waiting_at_end"] == 0
    assert f["sessions_admitted_mean"] == pytest.approx((5 + 44 + 1) / 100)  # b left when it failed


def test_the_sessions_report_sums_the_timeouts_over_seeds_beside_the_throughput():
    run = lambda seed, figures: {"policy": "fcfs", "sessions": 2, "seed": seed, "figures": figures}
    f = window_figures(_window_run(), SessionsProtocol(concurrency=2, window_s=100.0, warmup_s=10.0))
    (row,) = aggregate([run(1, f), run(2, f)])
    assert (row["timeouts"], row["retries"], row["failed_programs"]) == (14, 10, 4)
    head, _, line = markdown([row]).splitlines()
    assert head.startswith("| N | policy | output tok/s | timeouts | retries | failed programs | turns/session-h |")
    assert line.startswith("| 2 | fcfs | 0 | 14 | 10 | 4 |")
    old = {k: v for k, v in f.items() if k not in ("timeouts", "retries", "failed_programs")}
    assert "| 2 | fcfs | 0 | - | - | - |" in markdown(aggregate([run(1, old)]))  # runs from before timeouts


def test_a_rollout_step_counts_the_programs_its_timeouts_failed():
    f = step_figures(_window_run())
    assert (f["failed"], f["failed_programs"], f["timeouts"], f["retries"]) == (2, 2, 7, 5)
    assert f["output_tokens"] == 18 and f["makespan_s"] == 45.0  # b counts until it failed, 45 s after it came
    table = rollout_markdown(rollout_aggregate([{"policy": "fcfs", "seed": 1, "figures": f}]))
    assert "| 7 / 5 |" in table and "2 failed (2 timed out)" in table


def test_the_emulators_clients_set_a_deadline_only_when_they_give_up(monkeypatch):
    from continuum_lab.emulator import driver as driver_module
    from sglang_continuum.core.clock import ManualClock

    monkeypatch.setattr(driver_module.engine, "submit", lambda s, rid, ids, *a: object())
    deadlines = {}
    for timeout in (0.0, 5.0):
        driver = driver_module.ClosedLoopDriver(None, None, ManualClock(0.0), client_timeout_s=timeout)
        driver._start(_program("p"), 1.0)
        driver._send(driver._states[0], 1.0)
        deadlines[timeout] = [(at, rid) for at, _, _, rid in driver._events if rid is not None]
    assert deadlines == {0.0: [], 5.0: [(6.0, "p#0")]}  # 0: the client waits forever, as before


@pytest.mark.parametrize("flag", [["--client-timeout-s", "-1"], ["--client-retries", "-1"]])
def test_the_bench_refuses_a_negative_timeout_or_retry_count(flag, tmp_path):
    from continuum_lab.cli.bench import main

    with pytest.raises(SystemExit) as exc:
        main(["--workload", str(tmp_path / "unread.jsonl"), *flag, "--out", str(tmp_path)])
    assert exc.value.code == 2
