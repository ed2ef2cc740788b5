"""The live view: what the controller knows of each live program and of the server, as a plain dict.

Built only when asked (``GET /server_info``, ``adapter/introspection.py``), never per step, and
bounded: at most ``MAX_PROGRAMS_SHOWN`` programs, picked pinned first (most pinned tokens) then most
recently seen, without sorting the registry (the pins are few; the registry keeps its programs in
last-seen order). It reads; it never changes what it reads, except that the holds' heap drops the
entries of holds that ended (as the metrics' read does).

Every value is a builtin (str, int, float, bool, None, list, dict): SGLang ships the dict between
processes with msgpack and the HTTP server writes it as JSON. Program ids are shown as their
clients sent them: a scoped id shows its client's part only (the scope is a tenant's credential
hashed, which no reader should see), an inferred one its own name, and each is cut to
``MAX_ID_CHARS``. Times are seconds, rounded to 0.1.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterable, Optional

from sglang_continuum.core.counters import counter_values
from sglang_continuum.core.metadata import RESERVED_PREFIX, client_program_id
from sglang_continuum.core.pins import Pin
from sglang_continuum.core.programs import (
    PIN_EXPIRED,
    PIN_FLUSHED,
    PIN_KEPT,
    PIN_NONE,
    PIN_REFUSED,
    PIN_RELEASED,
    PIN_SHED,
    ProgramState,
)
from sglang_continuum.core.residency import RELEASED_FOR_BOUND
from sglang_continuum.core.silence import STALE_FACTOR
from sglang_continuum.core.turns import TurnTag

if TYPE_CHECKING:
    from sglang_continuum.core.controller import ContinuumController

VERSION = 1  # the shape's version: a reader can refuse a shape it does not know
MAX_PROGRAMS_SHOWN = 200
MAX_ID_CHARS = 48
PRESUMED_SHOWN = 10  # programs presumed ended from their silence, latest first
# the settings an operator reads to know which policy is in force (paths and endpoints left out)
SHOWN_SETTINGS = (
    "pin_budget_fraction",
    "max_ttl_s",
    "max_hold_s",
    "max_overtakes",
    "admission_control",
    "infer_programs",
    "offload_to_host",
    "terminal_tools",
)
# the states a program row can be in
RUNNING, WAITING, HELD, PAUSED, TOOL, STALE, IDLE = "running", "waiting", "held", "paused", "tool", "stale", "idle"
# what became of a program's last pin (``ProgramState.pin_end``), as a reader says it
PIN_END_TEXT = {
    PIN_KEPT: "pin hit",  # kept, and no pin now: its return consumed it
    PIN_NONE: "no pin: not worth its memory",
    PIN_REFUSED: "pin refused: budget held by earlier programs",
    PIN_EXPIRED: "pin expired",
    PIN_RELEASED: "pin released",
    PIN_FLUSHED: "pin flushed with the cache",
    RELEASED_FOR_BOUND: "released: hold bound",
}


def _s(seconds: float) -> float:
    return round(float(seconds), 1)


def display_id(program_id: str) -> tuple[str, bool]:
    """(what to show for ``program_id``, whether it is scoped): a scoped id's client part, never its scope."""
    client_id = client_program_id(program_id)
    scoped = client_id is not None
    if scoped:
        program_id = client_id
    elif program_id.startswith(RESERVED_PREFIX):
        program_id = program_id[len(RESERVED_PREFIX) :]  # an inferred program: "inferred-12"
    if len(program_id) > MAX_ID_CHARS:
        program_id = program_id[: MAX_ID_CHARS - 3] + "..."
    return program_id, scoped


def live_view(
    controller: "ContinuumController",
    *,
    waiting: Iterable[TurnTag] = (),
    now: Optional[float] = None,
    pool_tokens: Optional[int] = None,
    capacity_tokens: Optional[int] = None,
    limit: int = MAX_PROGRAMS_SHOWN,
) -> dict:
    """The live view of ``controller`` (a ``ContinuumController``). ``waiting``: the tags of the
    turns in the engine's waiting queue (which of them the door holds, and since when); ``now``:
    the time on the controller's clock (default its last step's); ``pool_tokens``: the device
    pool; ``capacity_tokens``: what the door fits the working set into (default: as at the last step)."""
    now = controller.clock() if now is None else now
    turns = _waiting_turns(controller, waiting)
    shown = _pick(controller, limit)
    rows = [_row(controller, state, turns.get(state.program_id), now) for state in shown]
    server = _server(controller, now, pool_tokens, capacity_tokens)
    server["programs_live"] = len(controller.programs)
    server["programs_shown"] = len(rows)
    server["programs_omitted"] = len(controller.programs) - len(rows)
    return {"version": VERSION, "server": server, "programs": rows, "presumed_ended": _presumed(controller, now)}


def _waiting_turns(controller, waiting: Iterable[TurnTag]) -> dict[str, TurnTag]:
    """Each program's waiting turn to show: its held one that waited longest, else its first queued."""
    found: dict[str, TurnTag] = {}
    for tag in waiting:
        pid = tag.meta.program_id
        if pid is None or (tag.program is not None and controller.programs.get(pid) is not tag.program):
            continue  # no program, or a turn of an incarnation that ended
        held = tag.held_back and not tag.hold_ended
        best = found.get(pid)
        if best is None or (held, -tag.queued_at) > (best.held_back and not best.hold_ended, -best.queued_at):
            found[pid] = tag
    return found


def _pick(controller, limit: int) -> list[ProgramState]:
    """Up to ``limit`` programs: most device-pinned tokens first, then most host-pinned, then most recently seen."""
    chosen: dict[str, ProgramState] = {}
    for table in (controller.pins, controller.host.pins):
        for pin in heapq.nlargest(limit, table, key=lambda p: p.tokens):
            state = controller.programs.get(pin.program_id)
            if len(chosen) < limit and state is not None:
                chosen.setdefault(pin.program_id, state)
    for state in controller.programs.recent():
        if len(chosen) >= limit:
            break
        chosen.setdefault(state.program_id, state)
    return list(chosen.values())


def _row(controller, state: ProgramState, turn: Optional[TurnTag], now: float) -> dict:
    pid = state.program_id
    pin, host = controller.pins.get(pid), controller.host.pins.get(pid)
    shown, scoped = display_id(pid)
    status, since = _state(state, turn, now)
    later = state.later_prompt_tokens
    return {
        "id": shown,
        "scoped": scoped,
        "state": status,
        "for_s": _s(since) if since is not None else None,
        "tool": state.pending_tool,
        "turns_arrived": state.turns_arrived,
        "turns_admitted": state.turns_admitted,
        "turns_finished": state.turns_finished,
        "in_flight": state.in_flight,
        "context_tokens": state.context_tokens,
        "pinned_tokens": pin.tokens if pin is not None else 0,
        "pin_left_s": _s(pin.deadline - now) if pin is not None else None,
        "host_pinned_tokens": host.tokens if host is not None else 0,
        "host_left_s": _s(host.deadline - now) if host is not None else None,
        "cached_share": round(state.later_cached_tokens / later, 3) if later > 0 else None,
        "later_prompt_tokens": later,
        "later_cached_tokens": state.later_cached_tokens,
        "last_decision": _decision(state, pin, host, turn, now),
    }


def _state(state: ProgramState, turn: Optional[TurnTag], now: float) -> tuple[str, Optional[float]]:
    """The row's state and how long it has been in it (None: not known)."""
    if turn is not None and turn.held_back and not turn.hold_ended:
        return (HELD if turn.new_program else PAUSED), now - turn.queued_at
    if turn is not None:
        return WAITING, now - turn.queued_at
    if state.in_flight > 0:
        return RUNNING, now - state.last_seen
    if state.pending_tool is not None and state.last_finish is not None:
        away = now - state.last_finish
        return (STALE if _stale(state, away) else TOOL), away
    return IDLE, (now - state.last_seen)


def _stale(state: ProgramState, away: float) -> bool:
    """Away past its own pace (``silence.py``): its pin is the first to go, and it is presumed ended soon."""
    return not state.announces_end and state.gaps > 0 and away > STALE_FACTOR * state.longest_gap


def _decision(state: ProgramState, pin: Optional[Pin], host: Optional[Pin], turn: Optional[TurnTag], now: float) -> str:
    """The latest decision the controller made about the program, in words."""
    if turn is not None and turn.held_back and not turn.hold_ended:
        if turn.due:
            return "hold bound passed: admitted next"
        kind = "held at the door (first turn)" if turn.new_program else "paused at its turn boundary"
        return kind if turn.due_at is None else f"{kind}; bound in {_s(turn.due_at - now)} s"
    if pin is not None:
        text = f"pinned {_s(pin.deadline - pin.created)} s for {state.pending_tool or 'its next turn'}"
        return text + " (held longer: its turn waits)" if pin.overstay else text
    end = state.pin_end
    text = PIN_END_TEXT.get(end) or (f"pin shed: {end[len(PIN_SHED) :]}" if end.startswith(PIN_SHED) else "")
    if not text:
        text = "admitted" if state.turns_admitted else "arrived"
    if host is not None:
        text += f"; host copy kept {_s(host.deadline - host.created)} s"
    return text


def _server(controller, now: float, pool_tokens: Optional[int], capacity_tokens: Optional[int]) -> dict:
    pins, host, working, holds = (
        controller.pins,
        controller.host,
        controller.door.working_set,
        controller.residency.holds,
    )
    settings = controller.settings
    shown = {name: getattr(settings, name, None) for name in SHOWN_SETTINGS}
    shown["terminal_tools"] = list(shown["terminal_tools"] or ())
    shown["program_ids_scoped"] = settings.program_scope_header is not None
    return {
        "pool_tokens": pool_tokens,
        "capacity_tokens": controller.residency.capacity_tokens if capacity_tokens is None else capacity_tokens,
        "pinned_programs": len(pins),
        "pinned_tokens": pins.pinned_tokens,
        "pin_budget_tokens": pins.budget_tokens,
        "pin_ceiling_tokens": pins.ceiling_tokens,
        "host_tier": host.attached,
        "host_pinned_programs": len(host.pins),
        "host_pinned_tokens": host.pins.pinned_tokens,
        "host_pin_budget_tokens": host.pins.budget_tokens,
        "held_turns": holds.waiting,
        "longest_hold_s": _s(holds.longest(now)),
        "holds_came_due": holds.came_due,
        "door_binding": controller.residency.binding(now),
        "working_set_programs": len(working),
        "working_set_tokens": working.tokens,
        "working_set_reserved_tokens": working.reserved_tokens(),
        "expected_final_context_tokens": working.expected_final_context,
        "rules": controller.rules.name,
        "ttl_model": controller.ttl_model.name,
        "settings": shown,
        "pins": counter_values(controller.counters),
        "sheds": counter_values(controller.sheds),
        "ended": counter_values(controller.program_counters),
    }


def _presumed(controller, now: float) -> list[dict]:
    """The latest programs presumed ended from their silence (gone from the registry; ``silence.py``
    remembers them to learn from a late return)."""
    remembered = controller.silence._remembered  # pid -> (last finish, tool), oldest first
    out = []
    for pid in reversed(remembered):
        if len(out) >= PRESUMED_SHOWN:
            break
        last_finish, tool = remembered[pid]
        out.append({"id": display_id(pid)[0], "tool": tool, "away_s": _s(now - last_finish)})
    return out
