"""The controller's counters, one dataclass per concern; ``core/series.py`` names each field's
Prometheus series, and ``counter_values`` is how snapshots and the exporter read them."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class PinCounters:
    created: int = 0
    hits: int = 0  # the next turn was admitted while the pin held its prefix
    expired: int = 0
    shed: int = 0  # released early to make room (budget, admission, memory pressure)
    refused: int = 0  # not created: the budget is held by earlier programs
    released: int = 0  # last step, abort, retraction, replaced, program forgotten
    flushed: int = 0  # dropped with the whole tree by a cache reset (/flush_cache)


@dataclass(slots=True)
class HostCounters:
    offloaded: int = 0  # device pins whose prefix went to a protected host copy
    offload_failed: int = 0  # no host copy could be made (host pool full of protected copies)
    host_hits: int = 0  # returning turns that loaded their prefix back from host
    host_hit_tokens: int = 0  # tokens loaded back instead of recomputed
    load_wait_s: float = 0.0  # what those loads cost the returns' own prefill steps (the reload cost)
    host_expired: int = 0
    host_released: int = 0  # next turn admitted, last step, abort, budget, flush


@dataclass(slots=True)
class AdmissionCounters:
    held_back: int = 0  # turns kept waiting by admission control (first turns, and paused returns)
    paused: int = 0  # of them, returns of programs paused at a turn boundary (``door.Door.pauses``)
    admission_sheds: int = 0  # pins shed so that a blocked turn could be admitted (any rule)
    admitted: int = 0  # requests admitted
    overdue_admitted: int = 0  # requests that were overdue when admitted


@dataclass(slots=True)
class ShedCounters:
    """Pins shed, by the rule that shed them (their sum is ``PinCounters.shed``)."""

    admission: int = 0  # for a blocked turn, pins of programs ranked after it
    idle: int = 0  # for a blocked turn, any pin: the engine would otherwise idle
    alloc: int = 0  # an allocation (prefill or decode) would otherwise fail
    budget: int = 0  # a new pin of an earlier program needed the pin budget
    stale: int = 0  # ... or any new pin: a pin whose program stayed away past its own usual gaps goes first
    hold_bound: int = 0  # for a blocked turn whose hold bound passed, any pin (its program released)
    gap: int = 0  # for a blocked turn, a pin whose program's tool call leaves time to serve it (to host and back)
    while_waiting: int = 0  # ... of which the program's next turn was already waiting (a certain hit lost)
    returned: int = 0  # programs whose pin was shed came back (the cost model's pin survival)


SHED_REASONS = ("admission", "idle", "alloc", "hold_bound", "gap")


@dataclass(slots=True)
class ProgramCounters:
    last_step: int = 0  # ended by a turn flagged as the last step
    terminal_tool: int = 0  # ended by a turn that called a terminal tool (a submit)
    released: int = 0  # ended by the client after the fact (/close_session)
    forgotten: int = 0  # dropped idle or by the registry bound
    refused: int = 0  # new ids the full registry turned away (nothing it may drop): served without one
    presumed_ended: int = 0  # silent past their own return horizon (their clients announce no ends)
    presumed_returned: int = 0  # ... of which came back after all (served as new programs)
    not_returned: int = 0  # ended while out on a tool call: that tool's return probability falls
    single_shot: int = 0  # taken as programs from their first turn (no id), not continued: dropped, pin released
    seen: int = 0  # programs whose first turn seen here made a new entry
    # Ended here by a last step that carried its step number N: ``affine`` if turns 1..N all
    # arrived here, ``split`` if some went to another worker (routing did not keep it together).
    affine: int = 0
    split: int = 0


@dataclass(slots=True)
class IdentityCounters:
    """Arriving requests by where their program id came from (``metadata.SOURCES``)."""

    program_id: int = 0  # custom_params.program_id (or job_id; or either at the top level of an OpenAI body)
    session_id: int = 0  # SGLang's session_id
    routing_key: int = 0  # SGLang's routing key (X-SMG-Routing-Key)
    inferred: int = 0  # attributed to a program from its prefix
    first_turn: int = 0  # continued nothing, taken as a new program's first turn
    none: int = 0  # no program: served as under FCFS

    def count(self, source: str) -> None:
        setattr(self, source, getattr(self, source) + 1)


def counter_values(counters) -> dict[str, int]:
    return {f.name: getattr(counters, f.name) for f in fields(counters)}
