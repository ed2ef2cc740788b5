"""The controller's event semantics, with a manual clock and fake handles."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.priority import Waiting, program_fcfs
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.turns import TurnTag
from tests.support import controller, request_fcfs


def make(ttl_model="fixed", budget=10_000, **kw):
    return controller(ttl_model, budget=budget, **kw)


def turn(pid, last=False, tool=None):
    return ProgramMeta(pid, last, tool)


def test_non_final_turn_pins_final_turn_does_not():
    c, clock = make(fixed_ttl_s=3.0)
    c.turn_arrived(turn("p"))
    out = c.turn_finished(turn("p"), context_tokens=100, handle="lock1")
    assert out.pin is not None and out.pin.deadline == 3.0 and out.ttl == 3.0
    tag = c.turn_arrived(turn("p", last=True))
    assert not tag.returning_miss
    assert c.turn_admitted(tag, 120).handle == "lock1" and c.counters.hits == 1
    out = c.turn_finished(turn("p", last=True), context_tokens=150, handle=None)
    assert out.pin is None and "p" not in c.programs and len(c.pins) == 0


def test_last_step_releases_a_pin_left_by_a_concurrent_turn():
    c, _ = make()
    c.turn_arrived(turn("p"))
    c.turn_arrived(turn("p", last=True))
    c.turn_finished(turn("p"), context_tokens=10, handle="h1")
    out = c.turn_finished(turn("p", last=True), context_tokens=12, handle=None)
    assert [p.handle for p in out.release] == ["h1"] and len(c.pins) == 0


def test_two_turns_in_flight_replace_not_crash():
    c, _ = make()
    c.turn_arrived(turn("p"))
    c.turn_arrived(turn("p"))
    a = c.turn_finished(turn("p"), context_tokens=10, handle="h1")
    b = c.turn_finished(turn("p"), context_tokens=11, handle="h2")
    assert a.pin is not None and [p.handle for p in b.release] == ["h1"]
    assert c.pins.get("p").handle == "h2"


def test_requests_without_program_never_pin():
    c, _ = make()
    tag = c.turn_arrived(ProgramMeta())
    assert tag.program_rank == tag.request_rank
    assert c.turn_finished(ProgramMeta(), context_tokens=99, handle="h").pin is None
    assert len(c.programs) == 0


def test_expiry_respects_waiting_turns_but_only_for_a_bounded_time():
    c, clock = make(fixed_ttl_s=1.0, max_wait_hold_s=4.0)
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p"), context_tokens=10, handle="h")
    clock.advance(1.5)
    assert c.step(lambda pid: True).expired == []  # next turn waits: held
    clock.advance(3.6)  # 5.1 > 1.0 + 4.0
    assert [p.handle for p in c.step(lambda pid: True).expired] == ["h"] and c.counters.expired == 1


def test_expiry_without_waiting_turn():
    c, clock = make(fixed_ttl_s=1.0)
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p"), context_tokens=10, handle="h")
    clock.advance(0.99)
    assert c.step(lambda pid: False).expired == []
    clock.advance(0.02)
    assert len(c.step(lambda pid: False).expired) == 1


def test_abort_releases_and_forgets_pending_tool():
    c, clock = make()
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p", tool="bash"), context_tokens=10, handle="h")
    assert [p.handle for p in c.turn_aborted(turn("p"))] == ["h"]


def test_tool_time_recorded_on_return_and_client_tool_wins():
    c, clock = make()
    c.turn_arrived(turn("p"))
    clock.advance(1.0)
    c.turn_finished(turn("p", tool="search"), context_tokens=10, tool="parsed_tool", handle="h")
    clock.advance(2.5)
    c.turn_arrived(turn("p"))
    assert c.stats.tool("search").samples() == [2.5]
    assert c.stats.tool("parsed_tool") is None


def test_ttl_is_capped_and_zero_means_no_pin():
    c, _ = make(fixed_ttl_s=100.0, max_ttl_s=7.0)
    c.turn_arrived(turn("p"))
    assert c.turn_finished(turn("p"), context_tokens=10, handle="h").pin.deadline == 7.0
    c2, _ = make(fixed_ttl_s=0.0)
    c2.turn_arrived(turn("q"))
    out = c2.turn_finished(turn("q"), context_tokens=10, handle="h")
    assert out.pin is None and out.ttl == 0.0


def test_budget_refusal_and_shed_counts():
    c, _ = make(budget=100)
    for pid in ("a", "b"):
        c.turn_arrived(turn(pid))
    c.turn_finished(turn("b"), context_tokens=80, handle="hb")  # b arrived later
    out = c.turn_finished(turn("a"), context_tokens=80, handle="ha")
    assert out.pin is not None and [p.handle for p in out.release] == ["hb"] and c.counters.shed == 1
    assert c.sheds.budget == 1 and c.sheds.while_waiting == 0
    c.turn_arrived(turn("z"))
    out = c.turn_finished(turn("z"), context_tokens=50, handle="hz")
    assert out.pin is None and c.counters.refused == 1


def test_priority_key_order():
    def key(retracted=False, overdue=False, pinned=False, program=0, request=0, gone=False, new=False):
        tag = TurnTag(ProgramMeta(), request, program, context_gone=gone, new_program=new)
        return program_fcfs(Waiting(tag, retracted, overdue, pinned))

    # pinned turns (resident prefix) before overdue ones; an overdue pinned turn is pinned; returns
    # whose context is cached in program order, then returns whose context is gone in arrival
    # order, then new programs
    expected = [
        "retracted",
        "pinned",
        "pinned_overdue",
        "overdue_old",
        "overdue_new",
        "old_program",
        "younger_program",
        "gone_early",
        "gone_late",
        "first_turn",
        "second_turn_before_the_first_was_admitted",
        "no_program",
    ]
    keys = {
        "retracted": key(retracted=True, program=9, request=9),
        "overdue_old": key(overdue=True, program=8, request=3),
        "overdue_new": key(overdue=True, program=0, request=6),
        "pinned": key(pinned=True, program=5, request=8),
        "pinned_overdue": key(pinned=True, overdue=True, program=6, request=5),
        "old_program": key(program=1, request=7),
        "younger_program": key(program=3, request=12),
        "gone_early": key(program=4, request=10, gone=True),
        "gone_late": key(program=0, request=13, gone=True),
        "first_turn": key(program=2, request=2, new=True),
        "second_turn_before_the_first_was_admitted": key(program=2, request=9, new=True),
        "no_program": key(program=11, request=11, new=True),
    }
    assert sorted(keys, key=keys.get) == expected


def test_overtaking_bound_counts_later_arrivals_admitted_ahead():
    c, clock = make(max_overtakes=3)
    ahead = [c.turn_arrived(turn(f"a{i}"), waiting_ahead=i) for i in range(2)]
    held = c.turn_arrived(turn("held"), waiting_ahead=2)  # two requests wait ahead of it
    later = [c.turn_arrived(turn(f"l{i}"), waiting_ahead=3 + i) for i in range(5)]
    clock.advance(100.0)  # time alone never makes it overdue
    assert not c.is_overdue(held)
    for tag in ahead:  # admitting the requests ahead of it is FCFS, not overtaking
        c.turn_admitted(tag, 10)
    for tag in later[:2]:
        c.turn_admitted(tag, 10)
    assert not c.is_overdue(held) and c.bounded.overdue_after(held) == 5
    c.turn_admitted(later[2], 10)  # the third later arrival admitted ahead of it
    assert c.is_overdue(held)
    c.turn_admitted(held, 10)
    record = c.last_admission
    assert record.overdue and record.overtaken == 3 and record.program_id == "held" and record.turn == 1
    assert c.admission.overdue_admitted == 1 and c.admission.admitted == 6


def test_an_overtake_counts_its_prefill_work():
    # What an overtake costs the turn it passes is the prefill the engine runs first, in units of
    # the mean prompt: ten returns that find all but a tenth of an average prompt cached pass it as
    # fast as one average prompt prefilled from scratch, one re-prefill of ten average prompts as
    # ten of them (counting requests, the cached returns made it overdue and the re-prefill passed
    # it as one).
    c, clock = make(max_overtakes=3)
    for i in range(300):
        c.turn_admitted(c.turn_arrived(turn(f"m{i}")), 1000)  # 1000-token prompts, nothing cached, of late
    held = c.turn_arrived(turn("held"))
    for i in range(10):
        c.turn_admitted(c.turn_arrived(turn(f"r{i}")), 1000, cached_tokens=900)
    assert not c.is_overdue(held) and c.bounded.overtaken(held) == pytest.approx(1.0, abs=0.05)
    c.turn_admitted(c.turn_arrived(turn("big")), 10_000, cached_tokens=0)
    assert c.is_overdue(held) and c.bounded.overtaken(held) > 9
    c.turn_admitted(held, 1000)
    assert c.last_admission.overdue and c.last_admission.overtaken > 9


def test_returns_that_hit_do_not_make_a_reprefill_of_an_ordinary_context_count_as_many():
    # Where returns mostly find their contexts cached, the mean prefill per admission is a small
    # append; measured against it, a re-prefill of an ordinary context counted as several overtakes,
    # waiting turns went overdue and program order (what keeps those contexts) gave way. Against
    # the mean prompt it counts as one.
    c, clock = make(max_overtakes=3)
    for i in range(300):
        c.turn_admitted(c.turn_arrived(turn(f"m{i}")), 1000, cached_tokens=950)  # returns that hit
    held = c.turn_arrived(turn("held"))
    for i in range(2):
        c.turn_admitted(c.turn_arrived(turn(f"lost{i}")), 1000, cached_tokens=0)  # two that lost theirs
    assert c.bounded.overtaken(held) == pytest.approx(2.0, abs=0.05) and not c.is_overdue(held)


def test_a_return_whose_pin_expired_or_was_refused_keeps_its_programs_place():
    # program order holds for a program the TTL model judged worth keeping, whether its pin ran
    # out (a tool slower than its TTL) or never fit the budget
    for budget, gap in ((10_000, 6.0), (500, 0.1)):
        c, clock = make(fixed_ttl_s=5.0, budget=budget)
        c.turn_arrived(turn("old"))
        c.turn_finished(turn("old"), context_tokens=1000, handle="h")
        newcomer = c.turn_arrived(turn("new"))
        clock.advance(gap)
        c.step(lambda pid: False)
        back = c.turn_arrived(turn("old"))
        assert back.returning_miss and back.program_rank < newcomer.program_rank


def not_looked_up():  # a turn whose place does not depend on the cache: the lookup must not run
    raise AssertionError("looked up what a turn that is not a return without a pin finds cached")


def test_a_return_that_finds_its_context_gone_queues_by_its_own_arrival_before_new_programs():
    # Program order pays by serving a program while its context is there; placed by its program's
    # age, a return that must re-prefill its whole context anyway puts the longest prompts at the
    # head of the queue (recorded tau-bench on a small pool: 3-5% behind fcfs with nothing pinned)
    c, clock = make(fixed_ttl_s=0.0)  # nothing is pinned
    for pid in ("gone", "gone2", "kept", "cut", "unknown"):
        c.turn_arrived(turn(pid))
        c.turn_finished(turn(pid), context_tokens=1000, handle=None)
    newcomer = c.turn_arrived(turn("new"))
    gone2 = c.turn_arrived(turn("gone2"), prompt_tokens=1100, cached_tokens=lambda: 0)
    gone = c.turn_arrived(turn("gone"), prompt_tokens=1100, cached_tokens=lambda: 400)
    kept = c.turn_arrived(turn("kept"), prompt_tokens=1100, cached_tokens=lambda: 600)
    cut = c.turn_arrived(turn("cut"), prompt_tokens=300, cached_tokens=lambda: 200)  # the client cut its history
    unknown = c.turn_arrived(turn("unknown"), prompt_tokens=1100)  # the adapter could not tell
    assert all(t.returning_miss for t in (gone, gone2, kept, cut, unknown))
    assert [t.context_gone for t in (gone, gone2, kept, cut, unknown)] == [True, True, False, False, False]
    order = sorted([newcomer, gone, gone2, kept, cut, unknown], key=lambda t: c.priority_key(t, False))
    assert order == [kept, cut, unknown, gone2, gone, newcomer]
    assert gone.program_rank < newcomer.program_rank  # shedding still ranks it by its program
    # a program's second turn sent before its first was admitted queues with it, after it
    also_new = c.turn_arrived(turn("new"), prompt_tokens=50, cached_tokens=not_looked_up)
    assert also_new.new_program and not also_new.context_gone
    assert c.priority_key(newcomer, False) < c.priority_key(also_new, False)


def test_a_pinned_return_keeps_its_programs_place_whatever_was_matched():
    c, clock = make(fixed_ttl_s=5.0)
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p"), context_tokens=1000, handle="h")
    newcomer = c.turn_arrived(turn("new"))
    back = c.turn_arrived(turn("p"), prompt_tokens=1100, cached_tokens=not_looked_up)
    assert not back.returning_miss and not back.context_gone
    assert c.priority_key(back, False) < c.priority_key(newcomer, False)


def test_a_retracted_turn_waits_afresh():
    c, clock = make(max_overtakes=2)
    tag = c.turn_arrived(turn("p"))
    for i in range(3):  # overtaken three times, then it ran and was retracted
        c.turn_admitted(c.turn_arrived(turn(f"o{i}")), 10)
    assert c.is_overdue(tag)
    c.turn_requeued(tag, waiting_ahead=0)
    assert not c.is_overdue(tag)  # earlier overtakes do not count
    for i in range(2):
        c.turn_admitted(c.turn_arrived(turn(f"q{i}")), 10)
    assert c.is_overdue(tag)


def test_bound_holds_in_the_pins_only_variant():
    c, clock = make(order=request_fcfs, max_overtakes=1)
    tag = c.turn_arrived(turn("p"))
    c.turn_admitted(c.turn_arrived(turn("q")), 10)
    assert c.is_overdue(tag)  # the bound is not inert in the pins-only mode


def test_an_overdue_first_turn_waits_for_room():
    # 1,640 tokens in flight in an 1,800-token pool; an overdue 300-token first turn does not fit
    # the pool: it waits like any other (the pool is already sized for growth)
    c, clock = make(max_overtakes=1)
    for pid in ("a", "b"):
        c.turn_admitted(c.turn_arrived(turn(pid)), 410, cached_tokens=400)
    new = c.turn_arrived(turn("new"))
    c.turn_admitted(c.turn_arrived(turn("c")), 410)  # two later arrivals, prefilled from scratch, overtake it
    c.turn_admitted(c.turn_arrived(turn("d")), 410)
    assert c.is_overdue(new)
    assert c.holds_back(new, 300, 1800) is True
    assert c.holds_back(new, 300, 2000) is False  # room in the pool: in it goes


def test_pins_only_ablation_orders_by_request_arrival_alone():
    c, clock = make(order=request_fcfs)
    first = c.turn_arrived(turn("first"))
    c.turn_finished(turn("first"), context_tokens=10, handle="h")  # first's next turn is pinned
    newcomer = c.turn_arrived(turn("newcomer"))
    again = c.turn_arrived(turn("first"))
    assert c.pins.get("first") is not None
    order = sorted([again, newcomer], key=lambda t: c.priority_key(t, False))
    assert order == [newcomer, again]  # with program order on, the pinned turn would go first
    assert c.priority_key(again, True) < c.priority_key(newcomer, False)  # retracted still first
    assert first.request_rank < newcomer.request_rank


def test_settings_from_env_and_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("max_overtakes = 8\nmax_ttl_s = 9.0\n")
    s = ContinuumSettings.load({"SGLANG_CONTINUUM_CONFIG": str(f), "SGLANG_CONTINUUM_MAX_TTL_S": "4"})
    assert s.max_overtakes == 8 and s.max_ttl_s == 4.0
    with pytest.raises(ValueError, match="invalid sglang-continuum settings"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_PIN_BUDGET_FRACTION": "2"})
    with pytest.raises(ValueError, match="program_idle_timeout_s .* must exceed"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_MAX_TTL_S": "700"})
    with pytest.raises(ValueError, match="no such file"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_CONFIG": str(tmp_path / "missing.toml")})


def test_an_unknown_setting_stops_start_up_naming_it(tmp_path):
    with pytest.raises(ValueError, match="SGLANG_CONTINUUM_MAX_OVERTAKE\\b"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_MAX_OVERTAKE": "8"})  # a typo is not silently the default
    f = tmp_path / "c.toml"
    f.write_text("max_overtake = 8\n")
    with pytest.raises(ValueError, match="max_overtake"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_CONFIG": str(f)})
    with pytest.raises(ValueError, match="rules 'no.such.module:X' does not resolve"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_RULES": "no.such.module:X"})
    with pytest.raises(ValueError, match="not a Rules"):
        ContinuumSettings(rules="sglang_continuum.core.rules:Timings")


def test_the_operator_has_at_most_nineteen_settings():
    # sixteen: stats_key_file, the keys that let shared statistics leave the host (CURVE);
    # seventeen: program_scope_header, which makes program ids no other tenant can use;
    # eighteen: max_hold_s, the bound on how long admission control holds a turn;
    # nineteen: predictive_upload, loading a host copy back before its program returns
    assert len(ContinuumSettings.model_fields) <= 19


def test_T_is_the_admission_wait_of_returning_misses():
    c, clock = make(ttl_model="cost")
    first = c.turn_arrived(turn("p"))
    clock.advance(0.5)
    c.turn_admitted(first, 500)
    assert len(c.ttl_model.queue_delay) == 0  # a first turn is not a returning miss
    out = c.turn_finished(turn("p"), context_tokens=600, handle=None)
    assert out.pin is None
    clock.advance(1.0)
    back = c.turn_arrived(turn("p"))
    assert back.returning_miss
    clock.advance(2.0)
    c.turn_admitted(back, 600)  # waited 2.0 s from arrival to admission, whatever its prefill
    assert c.ttl_model.queue_delay.mean == pytest.approx(2.0)


def test_shedding_spares_programs_whose_next_turn_waits():
    c, _ = make()
    for pid in ("a", "b", "c"):
        c.turn_admitted(c.turn_arrived(turn(pid)), 10)
        c.turn_finished(turn(pid), context_tokens=10, handle=pid)
    c.turn_arrived(turn("c"))  # c (the latest program) is back and waits: its pin is a certain hit
    waiting = {"c"}
    assert c.shed("admission", spares=(waiting.__contains__,)).program_id == "b"
    assert c.shed("admission", ranked_after=1, spares=(waiting.__contains__,)) is None  # only a ranks <= 1
    assert c.pins.get("c") is not None
    assert c.shed("idle").program_id == "c"  # the idle path takes what is left
    assert (c.sheds.admission, c.sheds.idle, c.sheds.while_waiting) == (1, 1, 1)
    c.check_integrity()


def test_a_program_with_a_turn_waiting_is_never_forgotten_idle():
    c, clock = make(program_idle_timeout_s=400.0)
    c.turn_admitted(c.turn_arrived(turn("p")), 10)
    c.turn_finished(turn("p"), context_tokens=10, handle=None)
    rank = c.programs.get("p").arrival_rank
    c.turn_arrived(turn("newer"))
    waiting = c.turn_arrived(turn("p"))  # p's next turn queues ... for longer than the idle timeout
    clock.advance(500.0)
    c.step(lambda pid: True)
    assert "p" in c.programs and c.programs.get("p").arrival_rank == rank == waiting.program_rank
    c.check_integrity()


def test_shipped_config_file_matches_the_defaults():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "continuum.toml"
    assert ContinuumSettings.load({"SGLANG_CONTINUUM_CONFIG": str(path)}) == ContinuumSettings()
    text = path.read_text()
    for name in ContinuumSettings.model_fields:
        assert name in text, f"{name} is not documented in configs/continuum.toml"


def test_warm_start_round_trip(tmp_path):
    from sglang_continuum.core.persistence import load_stats, write_stats

    c, clock = make(ttl_model="cost")
    for i in range(3):
        c.turn_arrived(turn("p"))
        c.turn_finished(turn("p", tool="grep"), context_tokens=10, handle=None)
        clock.advance(0.5 + i)
    c.turn_arrived(turn("p", last=True))
    c.turn_finished(turn("p", last=True), context_tokens=10, handle=None)
    path = tmp_path / "stats.json"
    write_stats(c.snapshot(), path)
    fresh, _ = make(ttl_model="cost")
    assert load_stats(fresh, path)
    assert fresh.stats.tool("grep").samples() == c.stats.tool("grep").samples() == [0.5, 1.5, 2.5]
    assert len(fresh.ttl_model.eta) == 1
    (tmp_path / "bad.json").write_text("{not json")
    assert not load_stats(fresh, tmp_path / "bad.json")  # a corrupt file is ignored, not fatal
    assert not load_stats(fresh, tmp_path / "missing.json")


def test_a_terminal_tool_ends_the_program_like_a_last_step():
    c, _ = make(fixed_ttl_s=3.0)
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p"), context_tokens=100, handle="h1", tool="bash:ls")
    tag = c.turn_arrived(turn("p"))
    c.turn_admitted(tag, 120)
    out = c.turn_finished(turn("p"), context_tokens=150, handle="h2", tool="submit")  # no last-step flag
    assert out.pin is None and "p" not in c.programs and len(c.pins) == 0
    assert c.program_counters.terminal_tool == 1 and c.program_counters.last_step == 0
    c2, _ = make(fixed_ttl_s=3.0, terminal_tools="finish, submit")  # as read from the environment
    assert c2.settings.terminal_tools == ("finish", "submit")
    c2.turn_arrived(turn("q"))
    assert c2.turn_finished(turn("q", tool="finish"), context_tokens=10, handle="h").pin is None


def test_end_program_releases_pins_at_once_and_teaches_non_return():
    c, clock = make(fixed_ttl_s=30.0)
    c.turn_arrived(turn("p"))
    out = c.turn_finished(turn("p"), context_tokens=100, handle="h1", tool="bash:python")
    assert out.pin is not None
    released = c.end_program("p")
    assert [p.handle for p in released] == ["h1"] and "p" not in c.programs and len(c.pins) == 0
    assert c.program_counters.released == 1 and c.program_counters.not_returned == 1
    assert c.stats.return_probability("bash:python") == pytest.approx(0.5)  # (0 + 1) / (1 + 1)
    assert c.end_program("p") == [] and c.program_counters.released == 1  # twice is harmless
    c.check_integrity()


def test_a_first_turn_found_single_shot_is_dropped_without_teaching_anything():
    """A request with no id taken as a program from its first turn, not continued: its pin goes
    and it is forgotten, learning neither a tool's non-return nor a program's length."""
    c, clock = make(fixed_ttl_s=30.0)
    c.turn_arrived(ProgramMeta("inferred-1", source="first_turn"))
    assert c.turn_finished(ProgramMeta("inferred-1", source="first_turn"), context_tokens=100, handle="h").pin
    assert [p.handle for p in c.end_program("inferred-1", single_shot=True)] == ["h"]
    assert "inferred-1" not in c.programs and len(c.pins) == 0
    counters = c.program_counters
    assert (counters.single_shot, counters.released, counters.not_returned) == (1, 0, 0)
    assert c.stats.return_probability("unknown") == pytest.approx(1.0)
    assert c.door.working_set.expected_final_context == 0  # not a program's final context
    assert c.end_program("inferred-1", single_shot=True) == [] and counters.single_shot == 1
    c.check_integrity()


def test_programs_forgotten_while_out_on_a_tool_count_as_not_returned():
    c, clock = make(program_idle_timeout_s=400.0, max_host_ttl_s=10.0)
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p"), context_tokens=10, handle="h", tool="giveup")
    clock.advance(401.0)
    plan = c.step(lambda pid: False)
    assert [p.handle for p in plan.expired + plan.released] == ["h"]
    assert c.program_counters.forgotten == 1 and c.stats.return_probability("giveup") < 1.0


def test_cost_model_stops_pinning_a_tool_whose_programs_never_return():
    """A generated workload where one tool always ends the program (the client releases it after
    the fact) and another always comes back after 0.2 s: the first tool's TTL falls to 0."""
    c, clock = make(ttl_model="cost", cold_start_k=5, fixed_ttl_s=0.0)
    c.ttl_model.queue_delay.add(3.0)  # a miss costs 3 s of queueing
    for i in range(40):
        pid = f"p{i}"
        c.turn_arrived(turn(pid))
        c.turn_finished(turn(pid), context_tokens=1000, handle="h", tool="bash:pytest")
        clock.advance(0.2)
        c.turn_admitted(c.turn_arrived(turn(pid)), 1100)
        c.turn_finished(turn(pid), context_tokens=1100, handle="h", tool="deploy")
        c.end_program(pid)  # 'deploy' never comes back
    assert c.stats.return_probability("deploy") == pytest.approx(1 / 41)
    assert c.stats.return_probability("bash:pytest") == 1.0
    c.turn_arrived(turn("z"))
    assert c.turn_finished(turn("z"), context_tokens=1000, handle="h", tool="bash:pytest").ttl > 0
    c.turn_arrived(turn("y"))
    assert c.turn_finished(turn("y"), context_tokens=1000, handle="h", tool="deploy").ttl == 0.0


def test_return_outcomes_survive_a_warm_start(tmp_path):
    from sglang_continuum.core.persistence import load_stats, write_stats

    c, _ = make(ttl_model="cost")
    c.turn_arrived(turn("p"))
    c.turn_finished(turn("p"), context_tokens=10, handle=None, tool="deploy")
    c.end_program("p")
    path = tmp_path / "stats.json"
    write_stats(c.snapshot(), path)
    fresh, _ = make(ttl_model="cost")
    assert load_stats(fresh, path)
    assert fresh.stats.return_probability("deploy") == c.stats.return_probability("deploy") == 0.5


def test_programs_count_as_affine_only_when_every_turn_arrived_here():
    c, _ = make()
    for step in (1, 2, 3):  # all three turns here
        c.turn_arrived(ProgramMeta("whole", step == 3, None, step))
        c.turn_finished(ProgramMeta("whole", step == 3, None, step), context_tokens=10, handle=None)
    c.turn_arrived(ProgramMeta("late", False, None, 2))  # turn 1 went to another worker
    c.turn_finished(ProgramMeta("late", False, None, 2), context_tokens=10, handle=None)
    c.turn_arrived(ProgramMeta("late", True, None, 3))
    c.turn_finished(ProgramMeta("late", True, None, 3), context_tokens=10, handle=None)
    c.turn_arrived(ProgramMeta("gap", False, None, 1))  # turn 2 went elsewhere
    c.turn_arrived(ProgramMeta("gap", True, None, 3))
    c.turn_finished(ProgramMeta("gap", True, None, 3), context_tokens=10, handle=None)
    c.turn_arrived(turn("nostep", last=True))  # no step numbers: counted as neither
    c.turn_finished(turn("nostep", last=True), context_tokens=10, handle=None)
    pc = c.program_counters
    assert (pc.seen, pc.affine, pc.split) == (4, 1, 2)


def test_affine_slot_is_stable_and_spreads():
    from sglang_continuum.core.programs import affine_slot

    slots = [affine_slot(f"prog-{i}", 4) for i in range(400)]
    assert slots == [affine_slot(f"prog-{i}", 4) for i in range(400)]
    assert set(slots) == {0, 1, 2, 3} and max(slots.count(s) for s in range(4)) < 140
    assert affine_slot("x", 1) == 0


def test_arrivals_are_counted_by_where_their_program_id_came_from():
    c, _ = make()
    c.turn_arrived(ProgramMeta("a"))
    c.turn_arrived(ProgramMeta("b", source="session_id"))
    c.turn_arrived(ProgramMeta("c", source="routing_key"))
    c.turn_arrived(ProgramMeta("c", source="routing_key"))
    c.turn_arrived(ProgramMeta("d", source="inferred"))
    c.turn_arrived(ProgramMeta("e", source="first_turn"))
    c.turn_arrived(ProgramMeta())
    assert c.snapshot()["identity"] == {
        "program_id": 1,
        "session_id": 1,
        "routing_key": 2,
        "inferred": 1,
        "first_turn": 1,
        "none": 1,
    }


def test_working_set_follows_the_pin_decision():
    # a program the cost model lets go (TTL 0) or whose pin expired is no reason to hold back a
    # new program; a pinned one is, and so is one with a turn in flight
    follows = True
    c, clock = make(fixed_ttl_s=0.0)
    c.turn_admitted(c.turn_arrived(turn("unpinned")), 600)
    assert c.turn_finished(turn("unpinned"), context_tokens=700, handle="h").pin is None
    new = c.turn_arrived(turn("new"))
    assert c.holds_back(new, 400, 1000) is not follows  # 700 + 400 > 1000 unless let go
    assert c.door.working_set.tokens == (0 if follows else 700)
    c.programs.check_integrity()

    c, clock = make(fixed_ttl_s=2.0)
    c.turn_admitted(c.turn_arrived(turn("pinned")), 600)
    assert c.turn_finished(turn("pinned"), context_tokens=700, handle="h").pin is not None
    new = c.turn_arrived(turn("new"))
    assert c.holds_back(new, 400, 1000)  # pinned: its room is kept either way
    clock.advance(2.5)
    assert len(c.step(lambda pid: False).expired) == 1
    assert c.holds_back(new, 400, 1000) is not follows  # expired: let go
    c.programs.check_integrity()


def test_with_a_host_tier_a_program_let_go_stays_in_the_working_set_while_it_is_seen():
    # its KV waits on host and its next turn loads it back: admission control, which then fits the
    # working set into both tiers, keeps its room until it ends or is unseen for the window
    from sglang_continuum.core.offload import ReloadCost

    c, clock = make(fixed_ttl_s=0.0)
    c.attach_host_tier(reload=ReloadCost(bytes_per_token=1000, bytes_per_s=1e9), host_budget_tokens=1000, hold_cost=0.5)
    c.turn_admitted(c.turn_arrived(turn("out")), 600)
    assert c.turn_finished(turn("out"), context_tokens=700, handle="h").pin is None
    assert c.door.working_set.tokens == 700
    new = c.turn_arrived(turn("new"))
    assert c.holds_back(new, 400, 1000)  # 700 + 400 > 1000
    clock.advance(c.door.working_set.window_s + 1)
    c.step(lambda pid: False)
    assert c.door.working_set.tokens == 0 and not c.holds_back(new, 400, 1000)  # idle: it left
    c.programs.check_integrity()


def test_with_a_host_tier_a_program_out_on_a_long_tool_call_keeps_its_room():
    # recorded Claude Code tool calls run past 30 s one time in four (p90 66 s); their KV waits on
    # host, so a new program let in meanwhile fills the host tier and the return re-prefills.
    # Without a host tier the window is the pin's business (an unpinned program leaves at once).
    from sglang_continuum.core.door import HOST_TIER_WORKING_SET_WINDOW_S, WORKING_SET_WINDOW_S
    from sglang_continuum.core.offload import ReloadCost

    c, clock = make(fixed_ttl_s=0.0)
    assert c.door.working_set.window_s == WORKING_SET_WINDOW_S
    c.attach_host_tier(reload=ReloadCost(bytes_per_token=1000, bytes_per_s=1e9), host_budget_tokens=1000, hold_cost=0.5)
    assert c.door.working_set.window_s == HOST_TIER_WORKING_SET_WINDOW_S > WORKING_SET_WINDOW_S
    c.turn_admitted(c.turn_arrived(turn("out")), 600)
    c.turn_finished(turn("out"), context_tokens=700, handle="h")
    new = c.turn_arrived(turn("new"))
    clock.advance(45.0)  # past the window without a host tier; before its client is presumed gone
    c.step(lambda pid: False)
    assert c.door.working_set.tokens == 700 and c.holds_back(new, 400, 1000)
    c.turn_admitted(c.turn_arrived(turn("out")), 800)  # it came back; out again
    c.turn_finished(turn("out"), context_tokens=900, handle="h")
    clock.advance(HOST_TIER_WORKING_SET_WINDOW_S + 1)
    c.step(lambda pid: False)
    assert c.door.working_set.tokens == 0 and not c.holds_back(new, 400, 1000)
    c.programs.check_integrity()


def test_a_program_with_a_turn_in_flight_stays_in_the_working_set():
    c, clock = make(fixed_ttl_s=0.0)
    c.turn_admitted(c.turn_arrived(turn("p")), 600)
    c.turn_arrived(turn("p"))  # a concurrent turn of it waits
    c.turn_finished(turn("p"), context_tokens=700, handle="h")
    assert c.door.working_set.tokens == 700


def test_admission_expecting_growth_holds_a_new_program_the_pool_will_not_hold_later():
    # programs that ended grew to 800 tokens; one in flight is at 300 today. A new 200-token first
    # turn fits today's sizes (500 <= 1000) but not what both will need (800 + 800)
    for held in (True,):
        c, clock = make()
        for pid in ("done1", "done2"):
            c.turn_admitted(c.turn_arrived(turn(pid)), 500)
            c.turn_finished(turn(pid), context_tokens=500, handle=None)
            c.turn_admitted(c.turn_arrived(turn(pid)), 800)
            c.turn_finished(turn(pid, last=True), context_tokens=800, handle=None)
        c.turn_admitted(c.turn_arrived(turn("running")), 300)
        new = c.turn_arrived(turn("new"))
        assert c.holds_back(new, 200, 1000) is held
        assert c.holds_back(new, 200, 2000) is False  # room for both grown
        c.programs.check_integrity()


def test_first_turns_taken_by_one_selection_count_against_the_door():
    # 400 tokens in flight in a 1000-token pool: one 350-token newcomer fits, two do not. The
    # working set hears of an admission only after the batch is formed, so the turns a selection
    # already took are passed in; without them both newcomers saw the same room and went together
    c, clock = make()
    c.turn_admitted(c.turn_arrived(turn("a")), 400)
    first, second = c.turn_arrived(turn("new-1")), c.turn_arrived(turn("new-2"))
    assert c.holds_back(first, 350, 1000) is False
    taken = c.admission_reservation(first, 350)
    assert taken == 350
    assert c.holds_back(second, 350, 1000, pending_tokens=taken) is True
    assert c.holds_back(second, 350, 1000) is False  # what the selection did before
    # a returning turn of a program in the working set reserves only its growth
    again = c.turn_arrived(turn("a"))
    assert c.admission_reservation(again, 450) == 50
    c.turn_admitted(first, 350)  # the batch is formed: the working set knows now
    assert c.holds_back(second, 350, 1000) is True
    c.check_integrity()


@given(
    st.lists(st.integers(1, 800), min_size=1, max_size=8),
    st.lists(st.integers(1, 500), min_size=1, max_size=6),
)
def test_a_selection_never_takes_more_programs_than_the_door_would_one_at_a_time(in_flight, newcomers):
    # however the newcomers are batched, the door with pending reservations lets in exactly what it
    # would have let in had each been admitted in a batch of its own
    pool = 2000

    def run(batched: bool) -> list[bool]:
        c, clock = make()
        for i, ctx in enumerate(in_flight):
            c.turn_admitted(c.turn_arrived(turn(f"old-{i}")), ctx)
        c.turn_finished(turn("old-0", last=True), context_tokens=in_flight[0])  # E
        tags = [c.turn_arrived(turn(f"new-{i}")) for i in range(len(newcomers))]
        passed, pending = [], 0
        for tag, tokens in zip(tags, newcomers):
            held = c.holds_back(tag, tokens, pool, pending_tokens=pending if batched else 0)
            passed.append(not held)
            if not held:
                if batched:
                    pending += c.admission_reservation(tag, tokens)
                else:
                    c.turn_admitted(tag, tokens)
        c.check_integrity()
        return passed

    assert run(batched=True) == run(batched=False)


def test_pin_survival_reads_a_window_not_the_whole_uptime():
    # after thousands of hits, a storm of sheds whose programs came back must move it within the
    # window (over the lifetime it would stay above 0.9 for hours)
    from sglang_continuum.core.pins import SURVIVAL_WINDOW

    c, _ = make()
    for _ in range(10_000):
        c.pinning.outcome(hit=True)
    assert c.ttl_model.pin_survival > 0.99
    for _ in range(SURVIVAL_WINDOW):
        c.pinning.outcome(hit=False)
    assert c.ttl_model.pin_survival < 0.01
    c.check_integrity()


def test_a_turn_of_an_ended_program_touches_nothing_of_its_successor():
    # p's first turn is live when p ends (a concurrent last step, /close_session); a new p arrives
    # and is pinned. The old turn then finishes or aborts: the new p keeps its pin and count
    c, _ = make()
    old = c.turn_arrived(turn("p"))
    c.end_program("p")
    new = c.turn_arrived(turn("p"))
    assert new.program is not old.program and c.programs.get("p").in_flight == 1
    out = c.turn_finished(turn("p"), context_tokens=10, handle="h-old", tag=old)
    assert out.pin is None and out.release == [] and c.programs.get("p").in_flight == 1
    assert c.turn_aborted(turn("p"), old) == [] and c.programs.get("p").in_flight == 1
    assert c.turn_finished(turn("p"), context_tokens=10, handle="h-new", tag=new).pin is not None
    assert c.programs.get("p").in_flight == 0
    c.check_integrity()


def test_a_leftover_turn_of_an_ended_program_neither_consumes_nor_releases_its_successors_pin():
    # p's turn waits when p ends; the id is reused, the new p finishes a turn and pins it. The old
    # turn's admission and retraction must leave the new pin and counts alone
    c, _ = make()
    old = c.turn_arrived(turn("p"))
    c.end_program("p")
    new = c.turn_arrived(turn("p"))
    c.turn_admitted(new, 10)
    assert c.turn_finished(turn("p"), context_tokens=10, handle="h-new", tag=new).pin is not None
    assert c.turn_admitted(old, 10) is None and c.counters.hits == 0
    assert c.turn_retracted(old) == [] and c.pins.get("p").handle == "h-new"
    state = c.programs.get("p")
    assert state.turns_admitted == 1 and state.context_tokens == 10
    assert c.host_returned(old, 5) == [] and c.host.counters.host_hits == 0
    c.check_integrity()


def waits_sampled(c) -> list[float]:
    observed = []
    c.ttl_model.observe_queue_delay = observed.append
    return observed


def test_a_pin_that_expires_while_its_turn_waits_samples_the_wait_as_a_shed_one_does():
    for end in ("expired", "shed"):
        c, clock = make(fixed_ttl_s=2.0, max_wait_hold_s=1.0)
        observed = waits_sampled(c)
        c.turn_arrived(turn("p"))
        c.turn_finished(turn("p"), context_tokens=10, handle="h")
        clock.advance(1.0)
        tag = c.turn_arrived(turn("p"))  # back within its TTL: the pin holds
        assert not tag.returning_miss
        if end == "expired":
            clock.advance(5.0)  # past its TTL and the hold while the turn waits
            assert [p.handle for p in c.step(lambda pid: True).expired] == ["h"]
        else:
            assert c.shed("admission").handle == "h"
            clock.advance(5.0)
        assert c.turn_admitted(tag, 12) is None
        assert observed == [5.0], end
        c.check_integrity()


def test_a_returns_admission_record_says_what_became_of_its_programs_pin():
    """Each way a pin ends before its program is back is named on the return's record, with the
    context the program had: what a benchmark splits the re-prefill by. A first turn has neither."""
    c, clock = make(fixed_ttl_s=5.0, budget=250)

    def back(pid, **kw):
        c.turn_admitted(c.turn_arrived(turn(pid)), 200, **kw)
        return c.last_admission

    for pid in "abcd":
        c.turn_admitted(c.turn_arrived(turn(pid)), 50)
        assert c.last_admission.pin_end is None and c.last_admission.previous_tokens is None
    c.turn_finished(turn("a"), context_tokens=100, handle="h1")
    c.turn_finished(turn("b"), context_tokens=100, handle="h2")
    c.turn_finished(turn("c"), context_tokens=60, handle="h3")  # 260 > 250, no later program's pin to push out
    c.turn_finished(turn("d"), context_tokens=300, handle="h4")  # over the whole budget
    record = back("a", cached_tokens=100)
    assert (record.pin_hit, record.pin_end, record.previous_tokens) == (True, "pinned", 100)
    assert c.shed("admission").program_id == "b"
    record = back("b", cached_tokens=0)
    assert (record.pin_hit, record.pin_end, record.previous_tokens) == (False, "shed-admission", 100)
    assert (back("c").pin_end, back("d").pin_end, c.last_admission.previous_tokens) == ("refused", "refused", 300)
    c.turn_finished(turn("a"), context_tokens=210, handle="h5")
    clock.advance(6.0)
    assert len(c.step(lambda pid: False).expired) == 1
    assert back("a").pin_end == "expired"


def test_a_turn_left_unpinned_is_recorded_as_no_pin():
    c, _ = make(fixed_ttl_s=0.0)
    c.turn_admitted(c.turn_arrived(turn("p")), 50)
    c.turn_finished(turn("p"), context_tokens=80, handle="h")
    state = c.programs.get("p")
    assert state.pin_end == "none" and state.let_go
    c.turn_admitted(c.turn_arrived(turn("p")), 120, cached_tokens=0)
    assert c.last_admission.pin_end == "none" and c.last_admission.previous_tokens == 80


def test_a_new_id_the_full_registry_refuses_is_served_without_a_program():
    c, _ = make(fixed_ttl_s=30.0)
    c.programs.max_programs = 2
    c.turn_arrived(turn("a"))  # in flight
    c.turn_arrived(turn("b"))
    c.turn_finished(turn("b"), context_tokens=50, handle="hb")  # pinned: expected back
    tag = c.turn_arrived(turn("x"))
    assert not tag.meta.has_program and tag.program_rank == tag.request_rank
    assert c.program_counters.refused == 1 and "x" not in c.programs
    assert c.turn_finished(tag.meta, context_tokens=20, handle="hx", tag=tag).pin is None
    assert "a" in c.programs and c.pins.get("b").handle == "hb"  # nothing of theirs was lost


def test_a_first_turns_sibling_is_re_keyed_once_its_program_is_admitted():
    # two turns of a new program wait (a client's parallel requests): once one is admitted the
    # other is a turn of a program in flight, not a new program's: the door does not hold it, and
    # it must not wait behind first turns the door does hold
    from sglang_continuum.core.priority import NEW, WAITING

    c, _ = make()
    a, b = c.turn_arrived(turn("p")), c.turn_arrived(turn("p"))
    assert c.priority_key(b, False)[0] == NEW
    c.turn_admitted(a, 100)
    assert c.rekeyed == {"p"} and c.priority_key(b, False)[0] == WAITING
