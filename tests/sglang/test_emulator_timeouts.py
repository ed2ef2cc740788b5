"""Tier 2: clients that give up, in the emulator: SGLang's real scheduler (the accounting model,
fcfs) in virtual time, built in this process (~10 s on 2 cores) so that its queues can be read at
the moment a client gives up."""

import itertools

import pytest

from continuum_lab.bench.report import summarize
from continuum_lab.bench.sessions import SessionsProtocol, window_figures
from continuum_lab.workloads.schema import Program, Turn

pytestmark = pytest.mark.sglang

POOL = 1000  # tokens: the long program (600 + 300) leaves no room for the blocked one's 500


def _program(name: str, prompt: int, output: int) -> Program:
    return Program(program_id=name, turns=[Turn(append_tokens=prompt, output_tokens=output)])


def _held(scheduler, rid: str) -> bool:
    """The scheduler still serves ``rid``: queued, or running and not marked to finish."""
    if any(r.rid == rid for r in scheduler.waiting_queue):
        return True
    return any(r.rid == rid and r.to_finish is None and not r.finished() for r in scheduler.running_batch.reqs)


def test_a_turn_past_its_timeout_is_aborted_in_the_scheduler_resent_and_then_fails_its_program(tmp_path, monkeypatch):
    from continuum_lab.bench.policies import parse_policy
    from continuum_lab.emulator import sglang_engine as engine
    from continuum_lab.emulator.driver import ClosedLoopDriver
    from continuum_lab.emulator.step_model import StepLatencyModel
    from continuum_lab.harness.inprocess import release_parallel_runtime
    from sglang_continuum.core.clock import ManualClock, use_clock

    # decode steps of ~10 ms: the long program decodes for ~3 s while the blocked one waits
    latency = StepLatencyModel(prefill=(0.02, 2e-5, 0.0), decode=(0.01, 0.0, 0.0), name="test")
    clock = ManualClock(0.0)
    flags, _ = parse_policy("fcfs", cpu=True)
    with use_clock(clock):
        args, _ = engine.server_args_for(engine.write_accounting_model(tmp_path / "model"), POOL, flags)
        scheduler = engine.build_scheduler(args)
    try:
        aborted, held_before = [], []
        real_abort = engine.abort

        def abort(s, rid):  # the client gives up: SGLang held the try until then, and not after
            held_before.append(_held(s, rid))
            real_abort(s, rid)
            aborted.append((rid, clock(), _held(s, rid)))

        monkeypatch.setattr(engine, "abort", abort)
        driver = ClosedLoopDriver(scheduler, latency, clock, vocab=1000, client_timeout_s=0.5, client_retries=2)
        small = (_program(f"small{i}", 50, 4) for i in itertools.count())
        sessions = itertools.chain([_program("long", 600, 300), _program("blocked", 500, 4)], small)
        with use_clock(clock):
            result = driver.run_sessions(sessions, concurrency=2, start_times=[0.0, 0.0], until=3.5)
    finally:
        release_parallel_runtime()

    # each try waited in SGLang's queue until its deadline, and left it then (one ~10 ms step late)
    tries = ["blocked#0", "blocked~r1#0", "blocked~r2#0", "small0#0", "small0~r1#0", "small0~r2#0"]
    assert held_before == [True] * 6 and [(rid, held) for rid, _, held in aborted] == [(r, False) for r in tries]
    assert [at for _, at, _ in aborted] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.5, 3.0], abs=0.02)
    records = {p.program_id: p for p in result.programs}
    blocked = records["blocked"]
    turn = blocked.turns[0]
    assert (turn.timeouts, turn.retries, turn.output_tokens, turn.first_token) == (3, 2, 0, None)
    assert turn.error.startswith("client timeout") and turn.finish == pytest.approx(1.5)
    assert not blocked.ok and blocked.timed_out
    # the next session took the failed one's place when its client gave up (small0 waited behind
    # "long" too; small1 arrived as "long" ended)
    assert records["small0"].planned_arrival == pytest.approx(1.5) and records["small0"].timed_out
    assert records["small1"].planned_arrival == pytest.approx(3.0) and records["small1"].ok
    assert records["long"].ok and records["long"].end < 3.5
    summary = summarize(result)
    assert (summary["timeouts"], summary["retries"], summary["timed_out_programs"]) == (6, 4, 2)
    # only answered turns count: "long"'s 300 tokens and the small sessions' 4 each, none of the blocked tries
    smalls = [p for p in result.programs if p.ok and p.program_id.startswith("small")]
    assert summary["output_tokens"] == 300 + 4 * len(smalls) and smalls
    figures = window_figures(result, SessionsProtocol(2, window_s=3.5, warmup_s=0.0))
    assert (figures["timeouts"], figures["retries"], figures["failed_programs"]) == (6, 4, 2)
    assert figures["longest_first_turn_wait_s"] == pytest.approx(1.5)  # the blocked turn: until its client gave up
    assert result.client_timeout_s == 0.5 and result.client_retries == 2
