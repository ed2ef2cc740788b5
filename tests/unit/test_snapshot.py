"""The live view (core/snapshot.py): what it says of each program and of the server, over a
controller driven through a few turns on a manual clock."""

import json

import pytest

from sglang_continuum.core.metadata import ProgramMeta, scope_of, scoped_program_id
from sglang_continuum.core.offload import ReloadCost
from sglang_continuum.core.snapshot import MAX_ID_CHARS, display_id, live_view
from tests.support import controller


def meta(pid, tool="bash", last=False):
    return ProgramMeta(pid, last, tool, announces_end=True)


def run_turn(c, pid, prompt, *, cached=None, tool="bash", out=20, handle=None):
    """One turn of ``pid``: arrives, admitted with ``prompt`` tokens (``cached`` of them found
    cached), finishes calling ``tool`` (pinned under ``handle``)."""
    tag = c.turn_arrived(meta(pid, tool))
    c.turn_admitted(tag, prompt, cached_tokens=cached)
    return c.turn_finished(meta(pid, tool), context_tokens=prompt + out, handle=handle or f"lock-{pid}", tag=tag)


def rows(view):
    return {row["id"]: row for row in view["programs"]}


def test_a_program_out_on_a_tool_shows_its_pin_its_turns_and_its_cached_share():
    c, clock = controller(fixed_ttl_s=12.0)
    run_turn(c, "agent-1", 100, cached=0)
    clock.advance(3.0)
    run_turn(c, "agent-1", 160, cached=120)  # the pin held turn 1's 120 tokens
    clock.advance(2.0)
    run_turn(c, "agent-1", 220, cached=110)  # a later turn that found less
    clock.advance(4.5)
    row = rows(live_view(c))["agent-1"]
    assert row["state"] == "tool" and row["tool"] == "bash" and row["for_s"] == 4.5
    assert (row["turns_admitted"], row["turns_finished"], row["in_flight"]) == (3, 3, 0)
    assert row["context_tokens"] == 240 and row["pinned_tokens"] == 240
    assert row["pin_left_s"] == 7.5  # a 12 s pin, 4.5 s in
    assert row["last_decision"] == "pinned 12.0 s for bash"
    # the first turn's prompt is no later turn's: (120 + 110) / (160 + 220)
    assert (row["later_prompt_tokens"], row["later_cached_tokens"]) == (380, 230)
    assert row["cached_share"] == pytest.approx(230 / 380, abs=1e-3)


def test_each_state_a_program_can_be_in_reads_as_its_own():
    c, clock = controller(fixed_ttl_s=2.0, max_hold_s=60.0)
    run_turn(c, "gone-out", 300)  # pinned, then its pin expires
    running = c.turn_arrived(meta("running"))
    c.turn_admitted(running, 500)
    clock.advance(2.5)
    c.step(lambda pid: False)
    new = c.turn_arrived(meta("new"))
    assert c.holds_back(new, 400, 800)  # 500 in flight + 400 > the capacity of 800: held
    clock.advance(3.0)
    view = live_view(c, waiting=[new], pool_tokens=1000, capacity_tokens=800)
    by_id = rows(view)
    assert by_id["gone-out"]["state"] == "tool" and by_id["gone-out"]["pinned_tokens"] == 0
    assert by_id["gone-out"]["last_decision"] == "pin expired"
    assert by_id["running"]["state"] == "running" and by_id["running"]["last_decision"] == "admitted"
    held = by_id["new"]
    assert held["state"] == "held" and held["for_s"] == 3.0
    assert held["last_decision"] == "held at the door (first turn); bound in 57.0 s"
    server = view["server"]
    assert server["held_turns"] == 1 and server["longest_hold_s"] == 3.0
    assert (server["pool_tokens"], server["capacity_tokens"]) == (1000, 800)
    assert server["settings"]["max_hold_s"] == 60.0 and server["settings"]["admission_control"] is True


def test_a_turn_queued_behind_others_is_waiting_and_a_hit_reads_as_one():
    c, clock = controller(fixed_ttl_s=5.0)
    run_turn(c, "p", 100)
    back = c.turn_arrived(meta("p"))
    clock.advance(1.0)
    assert rows(live_view(c, waiting=[back]))["p"]["state"] == "waiting"
    assert rows(live_view(c, waiting=[back]))["p"]["for_s"] == 1.0
    c.turn_admitted(back, 140, cached_tokens=120)
    row = rows(live_view(c))["p"]
    assert row["state"] == "running" and row["last_decision"] == "pin hit" and row["pinned_tokens"] == 0


def test_a_pin_released_for_a_turn_past_its_hold_bound_says_so():
    c, clock = controller(fixed_ttl_s=20.0)
    run_turn(c, "resident", 300)
    assert c.shed("hold_bound") is not None
    assert rows(live_view(c))["resident"]["last_decision"] == "released: hold bound"
    run_turn(c, "other", 300)
    assert c.shed("admission") is not None
    assert rows(live_view(c))["other"]["last_decision"] == "pin shed: admission"


def test_a_host_copy_shows_beside_the_device_pin_that_ended():
    c, clock = controller(fixed_ttl_s=1.0, host_ttl_s=30.0)
    c.attach_host_tier(reload=ReloadCost(bytes_per_token=1000), host_budget_tokens=1000, hold_cost=0.5)
    run_turn(c, "h", 100)
    clock.advance(1.5)
    [pin] = c.step(lambda _: False).expired
    c.offload(pin).pin.handle = "host-lock"
    view = live_view(c)
    row = rows(view)["h"]
    assert (row["pinned_tokens"], row["host_pinned_tokens"], row["host_left_s"]) == (0, 120, 30.0)
    assert row["last_decision"] == "pin expired; host copy kept 30.0 s"
    assert view["server"]["host_tier"] is True and view["server"]["host_pinned_tokens"] == 120


def test_pinned_programs_come_first_then_the_most_recent_and_the_rest_are_counted():
    c, clock = controller(fixed_ttl_s=0.0)
    for i in range(6):  # unpinned, seen one after the other
        run_turn(c, f"quiet-{i}", 100)
        clock.advance(1.0)
    c.ttl_model.ttl_s = 30.0  # now pin: a small and a large pin, both seen before the latest program
    run_turn(c, "small-pin", 50)
    run_turn(c, "big-pin", 900)
    clock.advance(1.0)
    c.ttl_model.ttl_s = 0.0
    run_turn(c, "latest", 100)
    view = live_view(c, limit=4)
    assert [r["id"] for r in view["programs"]] == ["big-pin", "small-pin", "latest", "quiet-5"]
    assert (view["server"]["programs_live"], view["server"]["programs_shown"]) == (9, 4)
    assert view["server"]["programs_omitted"] == 5


def test_scoped_ids_show_their_client_part_and_never_the_scope():
    c, _ = controller(fixed_ttl_s=5.0)
    scope = scope_of("tenant-a's bearer token")
    run_turn(c, scoped_program_id(scope, "run-1"), 100)
    run_turn(c, "x" * 200, 100)
    view = live_view(c)
    by_id = rows(view)
    assert by_id["run-1"]["scoped"] is True
    assert scope not in json.dumps(view)
    [long_id] = [i for i in by_id if i.startswith("x")]
    assert len(long_id) == MAX_ID_CHARS and long_id.endswith("...")
    assert display_id("continuum:inferred-12") == ("inferred-12", False)
    assert display_id("plain") == ("plain", False)


def test_programs_presumed_ended_from_their_silence_are_listed_after_they_leave():
    c, clock = controller(fixed_ttl_s=0.0)
    silent = ProgramMeta("quiet", tool_name="grep", source="routing_key")  # announces no end
    for gap in (0.0, 1.0):
        clock.advance(gap)
        tag = c.turn_arrived(silent)
        c.turn_admitted(tag, 100)
        c.turn_finished(silent, context_tokens=120, tag=tag, handle="h")
    clock.advance(2.0)  # past 1.5 x its longest gap of 1 s: stale, not yet presumed ended
    assert rows(live_view(c))["quiet"]["state"] == "stale"
    clock.advance(60.0)
    c.step(lambda pid: False)
    view = live_view(c)
    assert "quiet" not in rows(view) and view["server"]["ended"]["presumed_ended"] == 1
    assert view["presumed_ended"] == [{"id": "quiet", "tool": "grep", "away_s": 62.0}]


def _builtins_only(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _builtins_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_builtins_only(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def test_the_view_is_plain_data_and_reading_it_changes_nothing():
    c, clock = controller(fixed_ttl_s=5.0)
    run_turn(c, "a", 100)
    held = c.turn_arrived(meta("b"))
    c.holds_back(held, 5000, 100)
    first = live_view(c, waiting=[held])
    assert _builtins_only(first) and json.loads(json.dumps(first)) == first
    assert live_view(c, waiting=[held]) == first
    c.check_integrity()
    assert first["server"]["rules"] == c.rules.name and first["server"]["pin_budget_tokens"] == 10_000
    assert first["server"]["pins"]["created"] == 1
