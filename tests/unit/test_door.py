"""The door (core/door.py: program-level admission control) and the thrash signal (core/return_loss.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.return_loss import ReturnLossMeter
from tests.support import controller


def test_ratio_is_the_lost_share_of_previous_contexts_over_the_window():
    m = ReturnLossMeter(window=8, min_samples=2)
    m.observe(1000, 1000)  # everything still cached
    assert m.ratio == 0.0
    m.observe(1000, 0)  # all of it re-prefilled
    assert m.ratio == 0.5
    m.observe(2000, 200)  # 1800 lost
    assert m.ratio == pytest.approx(2800 / 4000)
    for _ in range(8):  # the window slides: eight full hits push the losses out
        m.observe(1000, 1500)  # a longer cached prompt than the previous context loses nothing
    assert m.ratio == 0.0
    m.check_integrity()


def test_too_few_returns_are_no_signal_and_a_flush_forgets_them():
    m = ReturnLossMeter(window=32, min_samples=8)
    for _ in range(7):
        m.observe(500, 0)
    assert m.ratio == 1.0 and not m.ready
    m.observe(500, 0)
    assert m.ready
    m.reset()
    assert m.ratio == 0.0 and not m.ready
    m.observe(0, 0)  # a program with no previous context is no sample
    assert m.observed == 8


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-5, 12_000)), max_size=200), st.integers(8, 40))
def test_window_sums_stay_exact(samples, window):
    m = ReturnLossMeter(window=window)
    for previous, cached in samples:
        m.observe(previous, cached)
        m.check_integrity()
        assert 0.0 <= m.ratio <= 1.0


def make(**kw):
    return controller(**kw)


def meta(pid):
    return ProgramMeta(pid, tool_name="bash")


def test_a_first_turn_waits_while_the_working_sets_fill_the_pool():
    c, _ = make(max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    newcomer = c.turn_arrived(meta("new"))
    assert c.holds_back(newcomer, 300, 1000) and c.admission.held_back == 1
    assert c.holds_back(newcomer, 300, 1000) and c.admission.held_back == 1  # counted once per request
    assert not c.holds_back(newcomer, 200, 1000)  # fits exactly
    c.check_integrity()


def test_admission_control_off_holds_nothing():
    c, _ = make(admission_control=False, max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    assert not c.holds_back(c.turn_arrived(meta("new")), 900, 1000)
    assert c.admission_reservation(c.turn_arrived(meta("other")), 900) == 0


def test_an_idle_engine_admits_a_newcomer():
    # 800 tokens in flight in a 1000-token pool: a 300-token newcomer is held while others run;
    # with the engine idle it passes (work-conserving)
    c, _ = make(max_overtakes=0)
    c.turn_admitted(c.turn_arrived(meta("a")), 800)
    small = c.turn_arrived(meta("small"))
    assert c.holds_back(small, 300, 1000)
    assert not c.holds_back(small, 300, 1000, idle=True)
    returning = c.turn_arrived(meta("a"))
    assert not c.holds_back(returning, 900, 1000)  # a later turn is never held


def test_while_the_door_binds_a_program_out_on_a_tool_stays_resident_where_the_engine_says_keeping_pays():
    """Residency: the TTL model pins nothing (0 s), but while the door holds a first turn the
    memory an admitted program keeps through its tool call would go to nobody but the batch: it is
    pinned for its tool's usual time (p90: 10 s) and keeps its room where rebuilding its context
    (12 s of engine time, one program resident) costs more than the place in the batch it leaves
    empty; not where a re-prefill is cheap (0.5 s: a decode-bound engine), nor without a held
    first turn. Its pin may fill the pins' ceiling (900 tokens), past their budget (500)."""
    for binding, rebuild_s, resident in ((True, 12.0, True), (True, 0.5, False), (False, 12.0, False)):
        c, clock = make(fixed_ttl_s=0.0, rebuild_s=rebuild_s, max_overtakes=0, budget=500, ceiling=900)
        for seconds in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
            c.stats.record("bash", seconds)
        a = c.turn_arrived(meta("a"))
        c.turn_admitted(a, 800)
        if binding:
            assert c.holds_back(c.turn_arrived(meta("new")), 300, 1000)
        clock.advance(1.0)
        out = c.turn_finished(meta("a"), context_tokens=800, handle=object(), tag=a)
        if resident:
            assert out.pin is not None and out.ttl == 10.0  # the tool's p90, not the model's 0
            assert "a" in c.door.working_set
        else:
            assert out.pin is None and "a" not in c.door.working_set, (binding, rebuild_s)
        c.check_integrity()


def test_a_young_program_is_priced_at_the_room_the_door_keeps_for_it():
    """A program of 100 tokens rebuilds in 0.2 s, but the residency keeps it room for the expected
    final context (900 tokens: 1.8 s) and it will be rebuilt at that size: with one slot and tools
    of p90 0.5 s, keeping it pays."""
    from sglang_continuum.core.programs import ProgramState
    from sglang_continuum.core.residency import Residency
    from sglang_continuum.core.tool_stats import ToolStats

    stats = ToolStats()
    for seconds in (0.1, 0.2, 0.3, 0.4, 0.5, 0.1, 0.2, 0.3, 0.4, 0.5):
        stats.record("bash", seconds)
    residency = Residency(True, stats, rebuild_s=lambda tokens: tokens / 500)
    ended = ProgramState("ended", arrival_rank=1, last_seen=0.0, turns_arrived=2, turns_finished=2)
    ended.context_tokens = 900
    residency.working_set.forgotten(ended)
    residency.binding_until = 10.0
    assert residency.working_set.floor == 900
    assert residency.resident_ttl("bash", now=1.0, context_tokens=100) == 0.5
    residency.working_set.reserve_growth = False  # growth not reserved: priced at its own 100 tokens
    assert residency.resident_ttl("bash", now=1.0, context_tokens=100) == 0.0


def test_where_unpinned_contexts_survive_their_tools_keeping_them_resident_does_not_pay():
    """A context let go is lost only if the pool gives its room away before its program is back.
    Rebuilding 900 tokens costs 1.8 s against a tool's p90 of 0.5 s (one slot): priced as lost
    (before eight unpinned returns are seen, or while they find their contexts gone) the program
    stays resident; where they find 80% of it still cached, a release loses 0.36 s and a pin only
    keeps the room from new programs."""
    from sglang_continuum.core.residency import Residency
    from sglang_continuum.core.tool_stats import ToolStats

    stats = ToolStats()
    for seconds in (0.1, 0.2, 0.3, 0.4, 0.5, 0.1, 0.2, 0.3, 0.4, 0.5):
        stats.record("bash", seconds)
    residency = Residency(True, stats, rebuild_s=lambda tokens: tokens / 500)
    residency.binding_until = 10.0
    for _ in range(7):
        residency.let_go_returned(900, 720, now=0.0)
    assert residency.release_loss() == 1.0  # too few returns: every release priced as lost
    assert residency.resident_ttl("bash", now=1.0, context_tokens=900) == 0.5
    residency.let_go_returned(900, 720, now=0.0)
    assert residency.release_loss() == pytest.approx(0.2)
    assert residency.resident_ttl("bash", now=1.0, context_tokens=900) == 0.0
    for _ in range(32):  # the pool fills: returns find their contexts gone again
        residency.let_go_returned(900, 0, now=0.0)
    assert residency.resident_ttl("bash", now=1.0, context_tokens=900) == 0.5
    residency.check_integrity()


def test_a_program_let_go_at_its_turns_end_tells_the_door_what_it_found_and_others_do_not():
    """Only a context unprotected all through its gap says what a release loses: not a first
    turn's, nor one whose pin ended partway (it was kept part of the gap)."""
    c, _ = make(fixed_ttl_s=0.0, max_overtakes=0)
    a = c.turn_arrived(meta("a"))
    c.turn_admitted(a, 1000)
    c.turn_finished(meta("a"), context_tokens=1000, handle=object(), tag=a)  # no pin (0 s)
    c.turn_arrived(meta("a"), prompt_tokens=1200, cached_tokens=lambda: 250)
    assert c.residency.let_go_loss.observed == 1 and c.residency.let_go_loss.measured == 0.75
    c.turn_arrived(meta("b"), prompt_tokens=1200, cached_tokens=lambda: 0)  # a first turn: nothing let go
    assert c.residency.let_go_loss.observed == 1
    p, clock = make(fixed_ttl_s=1.0, max_overtakes=0)
    b = p.turn_arrived(meta("b"))
    p.turn_admitted(b, 1000)
    assert p.turn_finished(meta("b"), context_tokens=1000, handle=object(), tag=b).pin is not None
    clock.advance(2.0)
    assert len(p.step(lambda pid: False).expired) == 1  # its pin ended partway through the gap
    p.turn_arrived(meta("b"), prompt_tokens=1200, cached_tokens=lambda: 0)
    assert p.residency.let_go_loss.observed == 0
    p.check_integrity()
    c.reset()  # a flush, not the load, took what returns find gone next
    assert c.residency.let_go_loss.measured == 0.0
    c.check_integrity()


def test_on_a_prefill_bound_engine_an_empty_batch_place_is_cheap_and_keeping_pays():
    """A re-prefill of 2 s against a tool's p90 of 10 s (one program resident): on an engine that
    spends all its time decoding the place the kept program leaves empty costs more, and it is let
    go; on one that spends 90% of it prefilling (a decode step batches, a prefill does not) the
    place costs 10 s x 0.1 = 1 s of decode, and the program stays resident."""
    for decode_steps, resident in ((10, False), (1, True)):
        c, _ = make(fixed_ttl_s=0.0, rebuild_s=2.0, max_overtakes=0, budget=500, ceiling=900)
        for seconds in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
            c.stats.record("bash", seconds)
        engine, now = c.residency.engine, 0.0
        engine.step(now, None)
        for i in range(10):  # ten 1-second steps, the first ``decode_steps`` of them decode
            now += 1.0
            engine.step(now, i < decode_steps)
        assert engine.decode_share == pytest.approx(decode_steps / 10, abs=0.02)
        a = c.turn_arrived(meta("a"))
        c.turn_admitted(a, 800)
        assert c.holds_back(c.turn_arrived(meta("new")), 300, 1000)  # the door binds
        out = c.turn_finished(meta("a"), context_tokens=800, handle=object(), tag=a)
        assert (out.pin is not None) is resident, decode_steps
        assert ("a" in c.door.working_set) is resident
        c.check_integrity()


def test_the_decode_share_counts_busy_steps_only_and_forgets_old_ones():
    from sglang_continuum.core.engine_time import HALF_LIFE_S, EngineTime

    engine = EngineTime()
    assert engine.decode_share == 1.0  # nothing seen: every place priced as decode
    engine.step(0.0, None)
    engine.step(5.0, None)  # idle: not the engine's time
    engine.step(6.0, False)  # a one-second prefill
    engine.step(106.0, True)  # 100 s is no step: the loop waited
    engine.step(107.0, True)
    assert engine.decode_share == pytest.approx(0.5, abs=0.01)
    for i in range(int(4 * HALF_LIFE_S)):  # four half-lives of decode
        engine.step(108.0 + i, True)
    assert engine.decode_share > 0.9
    engine.check_integrity()


def test_the_prefill_fit_recovers_a_step_cost_a_token_cost_and_an_attention_cost():
    """Steps timed as 10 ms + 30 us a token + 1 ns a token pair (appends behind cached prefixes and
    whole prompts, as a serving engine runs them): the fit gives back the three, and with them a
    rebuild from nothing; decode steps and empty prefills teach it nothing."""
    from sglang_continuum.core.engine_time import MIN_PREFILL_STEPS, EngineTime

    engine, now = EngineTime(), 0.0
    engine.step(now, None)
    shapes = [(512, 8000), (2048, 0), (256, 30000), (4096, 4096), (1024, 16000), (8192, 0)]
    for i, (e, p) in enumerate(shapes * 2):
        if i == MIN_PREFILL_STEPS - 1:
            assert engine.prefill.coefficients() is None  # too few steps to say
        pairs = e * (e + 2 * p)
        now += 0.010 + 30e-6 * e + 1e-9 * pairs
        engine.step(now, False, (e, pairs))
        now += 0.05
        engine.step(now, True)  # a decode step
        now += 0.05
        engine.step(now, False, (0, 0))  # a prefill interval that computed nothing
    c0, c1, c2 = engine.prefill.coefficients()
    assert (c0, c1, c2) == pytest.approx((0.010, 30e-6, 1e-9), rel=1e-6)
    assert engine.prefill.seconds(80_000) == pytest.approx(0.010 + 30e-6 * 80_000 + 1e-9 * 80_000**2)
    engine.check_integrity()


def test_the_prefill_fit_learns_what_a_step_pays_per_token_it_loaded_from_host():
    """Steps timed as the prefill's three terms plus 13.1 us a token loaded back from host (a 128 KiB
    token at 10 GB/s), on some steps: the fit gives back the four, the prefill's three as without
    loads; until 4,096 tokens in 4 loading steps are seen it says nothing of loads."""
    from sglang_continuum.core.engine_time import MIN_LOAD_STEPS, EngineTime

    engine, now = EngineTime(), 0.0
    engine.step(now, None)
    shapes = [(512, 8000, 0), (2048, 0, 3000), (256, 30000, 0), (4096, 4096, 9000), (1024, 16000, 0), (8192, 0, 500)]
    loads = 0
    for e, p, loaded in shapes * 3:
        pairs = e * (e + 2 * p)
        now += 0.010 + 30e-6 * e + 1e-9 * pairs + 13.1e-6 * loaded
        engine.step(now, False, (e, pairs, loaded))
        loads += loaded > 0
        if loads < MIN_LOAD_STEPS:
            assert engine.prefill.load_seconds_per_token() is None
        now += 0.05
        engine.step(now, True)  # a decode step
    assert engine.prefill.coefficients() == pytest.approx((0.010, 30e-6, 1e-9), rel=1e-6)
    assert engine.prefill.load_seconds_per_token() == pytest.approx(13.1e-6, rel=1e-6)
    engine.check_integrity()


def test_a_load_the_forward_hides_costs_nothing_and_without_loads_the_fit_is_the_three_term_one():
    """Loads that do not lengthen their steps (a copy overlapped with the compute) are priced at 0;
    steps that never loaded fit exactly as before the load term existed."""
    from sglang_continuum.core.engine_time import EngineTime

    with_loads, without = EngineTime(), EngineTime()
    for engine in (with_loads, without):
        engine.step(0.0, None)
    now = 0.0
    for i, (e, p) in enumerate([(512, 8000), (2048, 0), (256, 30000), (4096, 4096), (1024, 16000), (8192, 0)] * 2):
        pairs = e * (e + 2 * p)
        now += 0.010 + 30e-6 * e + 1e-9 * pairs
        with_loads.step(now, False, (e, pairs, 2000 * (i % 3)))
        without.step(now, False, (e, pairs))
    assert with_loads.prefill.load_seconds_per_token() == pytest.approx(0.0, abs=1e-12)
    assert without.prefill.load_seconds_per_token() is None
    assert with_loads.prefill.coefficients() == pytest.approx(without.prefill.coefficients(), rel=1e-9)
    assert without.prefill.coefficients() == pytest.approx((0.010, 30e-6, 1e-9), rel=1e-6)


def test_without_a_measured_bandwidth_a_reload_is_priced_at_what_the_engines_loads_cost(tmp_path):
    """With HiCache and no bandwidth measured, a miss costs the guessed transfer until the engine's
    steps show what a loaded token costs, then that; a configured bandwidth is never overridden."""
    from sglang_continuum.core.clock import ManualClock
    from sglang_continuum.core.controller import ContinuumController
    from sglang_continuum.core.offload import ReloadCost
    from sglang_continuum.core.settings import ContinuumSettings

    guess = ReloadCost(bytes_per_token=1000, bytes_per_s=1e9)  # 1 us a token
    for learn in (True, False):
        c = ContinuumController(ContinuumSettings(), clock=ManualClock())
        c.attach_host_tier(reload=guess, host_budget_tokens=10_000, hold_cost=0.5, learn_reload=learn)
        assert c.ttl_model.rebuild_s(10_000) == pytest.approx(guess.seconds(10_000))
        engine, now = c.residency.engine, 0.0
        engine.step(now, None)
        for i in range(12):  # 20 us a prefilled token, 5 us a loaded one
            e, loaded = 1024 * (1 + i % 3), 3000 * (i % 2)
            now += 20e-6 * e + 5e-6 * loaded
            engine.step(now, False, (e, e * e, loaded))
        expected = guess.latency_s + 5e-6 * 10_000 if learn else guess.seconds(10_000)
        assert c.ttl_model.rebuild_s(10_000) == pytest.approx(expected)
        c.check_integrity()


def test_the_prefill_fit_keeps_its_coefficients_non_negative():
    """Steps whose time does not grow with attention (a noisy engine) would fit a negative pair
    cost: the fit drops that term instead."""
    from sglang_continuum.core.engine_time import EngineTime

    engine, now = EngineTime(), 0.0
    engine.step(now, None)
    for e, p, seconds in [(1000, 0, 0.05), (1000, 50000, 0.04), (2000, 0, 0.09), (2000, 50000, 0.08)] * 4:
        now += seconds
        engine.step(now, False, (e, e * (e + 2 * p)))
    c = engine.prefill.coefficients()
    assert c is not None and (c >= 0).all() and c[2] == 0.0


def test_without_a_measured_profile_a_rebuild_is_priced_at_the_engines_own_prefill_cost(tmp_path):
    """The built-in guess until the engine has prefilled enough, then its own fit; a measured
    profile is never overridden."""
    from sglang_continuum.core.clock import ManualClock
    from sglang_continuum.core.controller import ContinuumController
    from sglang_continuum.core.cost_model import DEFAULT_PROFILE
    from sglang_continuum.core.settings import ContinuumSettings

    profile = tmp_path / "profile.json"
    profile.write_text('{"coeffs": [0.0, 0.001, 0.0]}')
    for configured in (None, str(profile)):
        c = ContinuumController(ContinuumSettings(prefill_profile=configured), clock=ManualClock())
        assert c.ttl_model.rebuild_s(1000) == pytest.approx(1.0 if configured else DEFAULT_PROFILE.seconds(1000))
        engine, now = c.residency.engine, 0.0
        engine.step(now, None)
        for i in range(12):  # 20 us a token, nothing else
            e = 1024 * (1 + i % 3)
            now += 20e-6 * e
            engine.step(now, False, (e, e * e))
        expected = 1.0 if configured else 20e-6 * 1000
        assert c.ttl_model.rebuild_s(1000) == pytest.approx(expected)
        assert c.residency.rebuild_s(1000) == pytest.approx(expected)  # the door prices residency the same
        c.check_integrity()


def _tools_of_p90_5s_and_two_programs_ended_at_900(c) -> None:
    """Tools of 1-5 s seen ten times, and two programs that ended at 900 tokens: the expected final context."""
    for seconds in (1.0, 2.0, 3.0, 4.0, 5.0) * 2:
        c.stats.record("bash", seconds)
    for pid in ("x", "y"):
        t = c.turn_arrived(ProgramMeta(pid))
        c.turn_admitted(t, 600)
        c.turn_finished(ProgramMeta(pid), context_tokens=600, handle=None, tag=t)
        t = c.turn_arrived(ProgramMeta(pid, is_last_step=True))
        c.turn_admitted(t, 900)
        c.turn_finished(ProgramMeta(pid, is_last_step=True), context_tokens=900, handle=None, tag=t)


def test_room_for_growth_is_reserved_only_where_a_lost_context_is_dear():
    """Programs that ended grew to 900 tokens; one of 300 runs. Where rebuilding a 900-token
    context costs more engine time than the tools' usual time (p90 5 s) in a batch place, the
    working set counts the runner at 900 and a 300-token newcomer waits in a 1000-token pool; where
    it is cheap (0.1 s), the door counts what programs hold and lets it in."""
    for rebuild_s, held in ((12.0, True), (0.1, False)):
        c, _ = make(fixed_ttl_s=0.0, rebuild_s=rebuild_s, max_overtakes=0)
        _tools_of_p90_5s_and_two_programs_ended_at_900(c)
        assert c.door.working_set.expected_final_context == 900
        c.turn_admitted(c.turn_arrived(meta("a")), 300)
        c.step(lambda pid: False, 1000)  # residency is priced once per step
        assert c.holds_back(c.turn_arrived(meta("new")), 300, 1000) is held, rebuild_s
        assert c.door.working_set.reserve_growth is held
        c.check_integrity()


def test_with_a_host_tier_the_door_holds_first_turns_only_where_a_lost_context_is_dear():
    """The same programs with HiCache on, the capacity both tiers': past it the host tier cycles
    and returns re-prefill. Where that costs 12 s of engine time the newcomer waits, as without a
    host tier; where it costs 0.1 s (a small model, short contexts) the door is open: a program
    of 800 tokens runs in a 1000-token capacity and a 300-token newcomer is let in beside it,
    which the device-only door (its capacity the pool, past which SGLang retracts running turns)
    would not do."""
    from sglang_continuum.core.offload import ReloadCost

    for host_tier, rebuild_s, held in ((True, 12.0, True), (True, 0.1, False), (False, 0.1, True)):
        c, _ = make(fixed_ttl_s=0.0, rebuild_s=rebuild_s, max_overtakes=0)
        if host_tier:
            c.attach_host_tier(reload=ReloadCost(bytes_per_token=1), host_budget_tokens=500, hold_cost=0.5)
        _tools_of_p90_5s_and_two_programs_ended_at_900(c)
        c.turn_admitted(c.turn_arrived(meta("a")), 800)
        c.step(lambda pid: False, 1000)
        assert c.door.working_set.reserve_growth is (rebuild_s == 12.0), (host_tier, rebuild_s)
        assert c.holds_back(c.turn_arrived(meta("new")), 300, 1000) is held, (host_tier, rebuild_s)
        c.check_integrity()


def test_residency_prices_a_lost_context_at_its_prefill_with_a_host_tier_too():
    """HiCache makes a device miss a reload (the TTL model's rebuild), but what the door and
    residency keep out is a context lost from both tiers: rebuilt by a prefill (1 s for 1000
    tokens here), not by a reload from host (a microsecond)."""
    from sglang_continuum.core.clock import ManualClock
    from sglang_continuum.core.controller import ContinuumController
    from sglang_continuum.core.offload import ReloadCost
    from sglang_continuum.core.settings import ContinuumSettings

    c = ContinuumController(ContinuumSettings(), clock=ManualClock())
    c.attach_host_tier(
        reload=ReloadCost(bytes_per_token=1, bytes_per_s=1e9, latency_s=0.0), host_budget_tokens=10, hold_cost=0.5
    )
    prefill = c.ttl_model.prefill_s(1000)
    assert c.ttl_model.rebuild_s(1000) == pytest.approx(1e-6)
    assert prefill > 1e-3 and c.residency.rebuild_s(1000) == pytest.approx(prefill)
    c.check_integrity()


def test_a_return_that_lost_its_context_is_paused_until_the_resident_programs_leave_room():
    c, clock = make(fixed_ttl_s=0.0, max_overtakes=0)
    a = c.turn_arrived(meta("a"))
    c.turn_admitted(a, 500)
    c.turn_finished(meta("a"), context_tokens=500, handle=object(), tag=a)  # no pin: a leaves
    b = c.turn_arrived(meta("b"))
    c.turn_admitted(b, 600)  # b runs: resident
    clock.advance(2.0)
    back = c.turn_arrived(meta("a"), prompt_tokens=700, cached_tokens=lambda: 0)  # its context gone
    kept = c.turn_arrived(meta("kept"))  # a first turn, for contrast: it would be held anyway
    assert back.context_gone and c.holds_back(back, 700, 1000)
    assert c.admission.paused == 1 and c.admission.held_back == 1
    assert not c.holds_back(back, 700, 1000, idle=True)  # never idles the engine
    c.turn_finished(meta("b"), context_tokens=600, handle=object(), tag=b)  # b out, no pin: room
    assert not c.holds_back(back, 700, 1000)  # resumed
    assert c.holds_back(kept, 700, 1000) is False and c.admission.paused == 1
    c.check_integrity()


def test_a_return_that_finds_its_context_or_has_a_host_tier_is_never_paused():
    for host_tier, cached in ((False, 500), (True, 0)):
        c, _ = make(fixed_ttl_s=0.0, max_overtakes=0)
        if host_tier:
            c.door.use_host_tier()
        a = c.turn_arrived(meta("a"))
        c.turn_admitted(a, 500)
        c.turn_finished(meta("a"), context_tokens=500, handle=object(), tag=a)
        c.door.working_set.let_go(c.programs.get("a"))  # out of the working set either way
        c.turn_admitted(c.turn_arrived(meta("b")), 900)
        back = c.turn_arrived(meta("a"), prompt_tokens=600, cached_tokens=lambda cached=cached: cached)
        assert not c.holds_back(back, 600, 1000) and c.admission.paused == 0
