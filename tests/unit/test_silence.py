"""Programs whose clients never say they ended (core/silence.py): their silence, read against
their own pace, ends them and gives their pins up first."""

from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.silence import PRESUME_FLOOR_S
from tests.support import controller


def silent(pid, tool="bash"):
    return ProgramMeta(pid, tool_name=tool, source="routing_key")  # no last-step flag: announces nothing


def announcing(pid, last=False, tool="bash"):
    return ProgramMeta(pid, last, tool, announces_end=True)


def turn(c, clock, meta, tokens, *, gap=0.0, handle=None):
    """A turn arrives after ``gap`` seconds out on a tool, runs, and finishes."""
    clock.advance(gap)
    tag = c.turn_arrived(meta)
    c.turn_admitted(tag, tokens)
    return c.turn_finished(meta, context_tokens=tokens + 10, handle=handle, tag=tag)


def test_a_silent_program_away_past_its_own_pace_is_presumed_ended_and_learned_from():
    c, clock = controller(fixed_ttl_s=0.0)  # no pins: silence alone decides
    for gap in (0.0, 1.0, 2.0):  # longest gap 2 s: horizon max(10 s, 4 x 2 s)
        turn(c, clock, silent("p"), 400 + 100 * int(gap), gap=gap)
    rank = c.programs.get("p").arrival_rank
    clock.advance(PRESUME_FLOOR_S - 0.5)
    c.step(lambda pid: False)
    assert "p" in c.programs  # not yet
    clock.advance(1.0)
    c.step(lambda pid: False)
    assert "p" not in c.programs and c.program_counters.presumed_ended == 1
    assert c.door.working_set.expected_final_context == 610  # how far it grew is learned
    assert c.stats.return_probability("bash") < 1.0  # and that "bash" ended it
    assert c.door.working_set.tokens == 0
    clock.advance(30.0)
    back = c.turn_arrived(silent("p"))  # it was only slow: a new program now, the latest rank
    assert back.program_rank > rank and back.turn == 1 and c.program_counters.presumed_returned == 1
    assert max(c.stats.tool("bash").samples()) >= 40.0  # the long call is a sample after all
    c.check_integrity()


def test_a_program_whose_client_announces_ends_is_never_presumed_ended():
    c, clock = controller(fixed_ttl_s=0.0)
    for gap in (0.0, 1.0):
        turn(c, clock, announcing("p"), 400, gap=gap)
    clock.advance(500.0)
    c.step(lambda pid: False)
    assert "p" in c.programs and c.program_counters.presumed_ended == 0


def test_a_silent_program_holding_a_pin_is_not_presumed_ended_before_the_pin_ends():
    c, clock = controller(fixed_ttl_s=25.0)
    for gap in (0.0, 1.0):
        turn(c, clock, silent("p"), 400, gap=gap, handle=f"h{gap}")
    clock.advance(15.0)
    c.step(lambda pid: False)
    assert "p" in c.programs and c.pins.get("p") is not None  # the cost model still expects it
    clock.advance(15.0)
    plan = c.step(lambda pid: False)  # the pin expired; the program is presumed ended at the next look
    c.step(lambda pid: False)
    assert [p.handle for p in plan.expired] == ["h1.0"] and "p" not in c.programs
    c.check_integrity()


def test_a_stale_pin_gives_the_budget_up_before_any_live_program_whatever_its_rank():
    c, clock = controller(fixed_ttl_s=30.0, budget=1000)
    for gap in (0.0, 1.0):  # "old" arrived first, comes back within 1 s, then goes silent
        turn(c, clock, silent("old"), 400, gap=gap, handle=f"old{gap}")
    turn(c, clock, silent("live"), 400, handle="live")
    clock.advance(2.0)  # old: away 2 s > 1.5 x its longest gap (1 s): stale
    out = turn(c, clock, silent("new"), 300, handle="new")  # needs the budget "old" holds
    assert out.pin is not None and [p.handle for p in out.release] == ["old1.0"]
    assert c.pins.get("live") is not None and c.sheds.stale == 1
    c.check_integrity()
    # under memory pressure too: the stale pin goes first, before the latest program's
    c2, clock2 = controller(fixed_ttl_s=30.0)
    for gap in (0.0, 1.0):
        turn(c2, clock2, silent("old"), 400, gap=gap, handle=f"old{gap}")
    turn(c2, clock2, silent("latest"), 400, handle="latest")
    clock2.advance(2.0)
    assert c2.shed("alloc").handle == "old1.0" and c2.sheds.stale == 1
    assert c2.shed("alloc").handle == "latest"  # then the usual order
    c2.check_integrity()
