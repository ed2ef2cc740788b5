"""Every Prometheus series Continuum exports: one table that the metrics exporter, the benchmark
reports and ``docs/metrics.md`` all use (``tests/unit/test_series.py`` checks that page against it).

``source`` names where the value lives: ``counters.<field>`` (``PinCounters``),
``host.<field>`` (``HostCounters``), ``admission.<field>`` (``AdmissionCounters``),
``programs.<field>`` (``ProgramCounters``), ``sheds.<field>`` (``ShedCounters``),
``identity.<field>`` (``IdentityCounters``), ``holds.<field>`` (``residency.Holds``),
``saver.<field>`` (``StatsSaver``), or ``gauge.<name>`` (computed by the exporter).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "sglang:continuum_"


@dataclass(frozen=True, slots=True)
class Series:
    short: str  # name without the prefix (and without _total for counters)
    kind: str  # "gauge" | "counter" | "histogram"
    source: str
    doc: str
    host_only: bool = False  # exported only with HiCache

    @property
    def name(self) -> str:
        """The name a scrape shows (counters end in _total)."""
        return PREFIX + self.short + ("_total" if self.kind == "counter" else "")


# name (without the prefix) | kind | source | host only | what it counts or measures
_TABLE = """
# gauges
pinned_programs               | gauge     | gauge.pinned_programs               | -    | Programs whose prefix is TTL-pinned.
pinned_tokens                 | gauge     | gauge.pinned_tokens                 | -    | Tokens held by TTL pins (path lengths).
pin_budget_tokens             | gauge     | gauge.pin_budget_tokens             | -    | Most tokens pins may hold.
tracked_programs              | gauge     | gauge.tracked_programs              | -    | Programs the registry remembers.
programs_in_flight            | gauge     | gauge.programs_in_flight            | -    | Programs in the working set (a turn waiting or running, or out on a tool while pinned, or with HiCache while seen in the last 120 s).
working_set_tokens            | gauge     | gauge.working_set_tokens            | -    | Current context tokens of programs in flight.
working_set_reserved_tokens   | gauge     | gauge.working_set_reserved_tokens   | -    | Tokens admission control keeps for programs in flight: each at least the expected final context while growth is reserved.
growth_reserved               | gauge     | gauge.growth_reserved               | -    | 1 while admission control reserves room for programs to grow to the expected final context; 0 where the engine's price (no host tier) says a lost context is cheaper to rebuild than the batch place its room would hold.
decode_share                  | gauge     | gauge.decode_share                  | -    | Share of the engine's busy time spent in decode steps (decayed over a minute of engine time; 1 until a second of it is seen): what a place left empty in the batch costs, which prices keeping a program resident (no host tier).
prefill_step_seconds          | gauge     | gauge.prefill_step_seconds          | -    | The engine's prefill cost per step, c0 (fitted to the scheduler's prefill steps as c0 + c1 * tokens + c2 * pairs, decayed over a minute of engine time; 0 until 4,096 tokens in 8 steps are seen): what re-prefilling a lost context costs where no measured prefill profile is configured.
prefill_seconds_per_token     | gauge     | gauge.prefill_seconds_per_token     | -    | The engine's prefill cost per new token, c1 (fitted to the scheduler's prefill steps as c0 + c1 * tokens + c2 * pairs, decayed over a minute of engine time; 0 until 4,096 tokens in 8 steps are seen): what re-prefilling a lost context costs where no measured prefill profile is configured.
prefill_seconds_per_pair      | gauge     | gauge.prefill_seconds_per_pair      | -    | The engine's prefill cost per attention token pair (e^2 + 2ep for e new tokens behind p cached), c2 (fitted to the scheduler's prefill steps as c0 + c1 * tokens + c2 * pairs, decayed over a minute of engine time; 0 until 4,096 tokens in 8 steps are seen): what re-prefilling a lost context costs where no measured prefill profile is configured.
expected_final_context_tokens | gauge     | gauge.expected_final_context_tokens | -    | Mean final context of the last 64 programs that ended (0 before any did).
programs_held_back            | gauge     | gauge.programs_held_back            | -    | Waiting first turns of new programs that admission control is holding back.
return_loss_ratio             | gauge     | gauge.return_loss_ratio             | -    | Share of returning programs' previous contexts found gone (last 32 returning turns): the thrash signal.
release_loss_ratio            | gauge     | gauge.release_loss_ratio            | -    | Share of their previous contexts that programs let go unpinned at their turn's end found gone when they came back (last 32 of them; 1 until 8 are seen): what letting a context go loses, which prices keeping a program resident (no host tier).
overtake_budget               | gauge     | gauge.overtake_budget               | -    | Later arrivals that may be admitted ahead of a returning turn entering the queue now before it is overdue, in average prompts prefilled (max_overtakes, down to 2 as the return loss passes 0.5; a first turn keeps max_overtakes; 0: no bound).
oldest_wait_seconds           | gauge     | gauge.oldest_wait_seconds           | -    | How long the oldest waiting request has waited.
longest_hold_seconds          | gauge     | gauge.longest_hold_seconds          | -    | How long the longest-waiting turn that admission control held (a first turn or a paused return), not yet admitted, has waited; max_hold_s bounds it, plus the time to free room once it is due.
# pin counters
pins_created                  | counter   | counters.created                    | -    | Pins created after a non-final turn.
pin_hits                      | counter   | counters.hits                       | -    | Next turns admitted while their pin held the prefix.
pin_expiries                  | counter   | counters.expired                    | -    | Pins released at their deadline.
pin_sheds                     | counter   | counters.shed                       | -    | Pins released early under memory, admission or budget pressure.
pins_refused                  | counter   | counters.refused                    | -    | Pins not created: budget held by earlier programs.
pin_releases                  | counter   | counters.released                   | -    | Pins released by last step, abort, retraction, replacement or a forgotten program.
pins_flushed                  | counter   | counters.flushed                    | -    | Pins dropped with the whole cache by /flush_cache.
# admission
held_back_requests            | counter   | admission.held_back                 | -    | Turns admission control kept waiting (once per request): new programs' first turns and paused returns.
programs_paused               | counter   | admission.paused                    | -    | Of them, returns that found their context gone and were paused at a turn boundary until the working set left them room (no host tier).
admission_sheds               | counter   | admission.admission_sheds           | -    | Pins shed so that a blocked turn could be admitted (ranked after it, or any rank when the engine would idle, the turn's hold bound passed or the pin is stale).
holds_due                     | counter   | holds.came_due                      | -    | Held turns whose hold bound (max_hold_s from their arrival) passed: no longer held, admitted next.
requests_admitted             | counter   | admission.admitted                  | -    | Requests admitted.
overdue_admitted              | counter   | admission.overdue_admitted          | -    | Requests that were overdue (overtaken as many times as their budget) when admitted.
# pins shed, by rule (they sum to pin_sheds)
pin_sheds_admission           | counter   | sheds.admission                     | -    | Pins of programs ranked after a blocked turn, shed so it could be admitted.
pin_sheds_idle                | counter   | sheds.idle                          | -    | Pins of any rank shed for a blocked turn because the engine would otherwise idle.
pin_sheds_alloc               | counter   | sheds.alloc                         | -    | Pins shed because an allocation would otherwise fail.
pin_sheds_budget              | counter   | sheds.budget                        | -    | Pins of later programs shed for an earlier one's pin.
pin_sheds_hold_bound          | counter   | sheds.hold_bound                    | -    | Pins of any rank shed for a blocked turn whose hold bound passed: resident programs released, each to take its own turn (one rebuild each: what the bound costs).
pin_sheds_stale               | counter   | sheds.stale                         | -    | Pins shed first, whatever their rank, because their program (whose client announces no ends) stayed away past its own pace.
pin_sheds_while_waiting       | counter   | sheds.while_waiting                 | -    | Pins shed while their program's next turn was already waiting (a certain hit thrown away).
pin_sheds_returned            | counter   | sheds.returned                      | -    | Programs that came back after their pin was shed (the cost model's pin survival reads it).
# how programs ended
programs_ended_last_step      | counter   | programs.last_step                  | -    | Programs ended by a turn flagged last step.
programs_ended_by_tool        | counter   | programs.terminal_tool              | -    | Programs ended by a turn that called a terminal tool (terminal_tools, e.g. a submit).
programs_released             | counter   | programs.released                   | -    | Programs ended by the client after the fact (/close_session with the program id).
programs_forgotten            | counter   | programs.forgotten                  | -    | Programs forgotten idle or by the registry bound.
programs_refused              | counter   | programs.refused                    | -    | New program ids turned away by the full registry (every program it could drop has a turn in flight or a pin): their turns are served as without an id until room frees.
programs_presumed_ended       | counter   | programs.presumed_ended             | -    | Programs whose client announces no ends, presumed ended: away past their own return horizon.
programs_presumed_returned    | counter   | programs.presumed_returned          | -    | Of those, programs that came back after all (served as new programs).
programs_not_returned         | counter   | programs.not_returned               | -    | Programs that ended while out on a tool call (lowers that tool's return probability).
programs_single_shot          | counter   | programs.single_shot                | -    | Requests with no id taken as programs from their first turn and not continued within the horizon first turns are watched for: dropped, their pin released.
# where each request's program id came from (README "Request metadata")
requests_by_program_id        | counter   | identity.program_id                 | -    | Requests whose program id came from custom_params.program_id.
requests_by_session_id        | counter   | identity.session_id                 | -    | Requests whose program id was SGLang's session_id.
requests_by_routing_key       | counter   | identity.routing_key                | -    | Requests whose program id was SGLang's routing key (X-SMG-Routing-Key).
requests_inferred             | counter   | identity.inferred                   | -    | Requests with no id attributed to a program from their prefix (infer_programs).
requests_first_turn           | counter   | identity.first_turn                 | -    | Requests with no id that continued nothing, taken as a new program: most such requests lately were continued.
requests_without_program      | counter   | identity.none                       | -    | Requests served with no program (as under fcfs).
# routing: did each program's turns reach one worker? (needs the client's step numbers)
programs_seen                 | counter   | programs.seen                       | -    | Programs whose first turn seen here was new to this worker.
programs_affine               | counter   | programs.affine                     | -    | Programs that ended here (last step with its step number N) after turns 1..N all arrived here.
programs_split                | counter   | programs.split                      | -    | Programs that ended here (last step with its step number) after some turns went to another worker.
# tool statistics shared between workers (stats_publish_endpoint / stats_peer_endpoints)
stats_samples_sent            | counter   | exchange.sent                       | -    | Tool-statistics samples published to peers.
stats_samples_received        | counter   | exchange.received                   | -    | Peers' tool-statistics samples merged here.
stats_samples_dropped         | counter   | exchange.dropped                    | -    | Samples not shared: outbox full, or the publish queue full (a slow or dead peer).
stats_peers                   | gauge     | gauge.stats_peers                   | -    | Peers heard from within the last 5 seconds.
# statistics persistence
stats_saves                   | counter   | saver.saved                         | -    | Tool statistics written to stats_path.
stats_save_failures           | counter   | saver.failures                      | -    | Failed statistics writes (serving continues).
# histogram
ttl_seconds                   | histogram | ttl                                 | -    | TTL chosen per pin decision.
hold_seconds                  | histogram | holds                               | -    | Wait of each turn admission control held, from its arrival to its admission, labelled turn="first_turn" (a new program's first turn) or turn="pause" (a return paused at its turn boundary).
# host tier (HiCache)
host_pinned_programs          | gauge     | gauge.host_pinned_programs          | host | Programs whose host copy is protected.
host_pinned_tokens            | gauge     | gauge.host_pinned_tokens            | host | Host tokens protected by host pins.
host_load_seconds_per_token   | gauge     | gauge.host_load_seconds_per_token   | host | The engine's cost per token loaded back from host, c3 (a fourth term of the prefill fit, c3 * loaded, on the steps whose selection loaded host KV; 0 until 4,096 loaded tokens in 4 steps are seen): what a reload costs where no host bandwidth is measured (host_bandwidth_bytes_per_s or the prefill profile's); a copy the forward hides costs 0.
offloads                      | counter   | host.offloaded                      | host | Expired or shed pins whose prefix went to a protected host copy.
offload_failures              | counter   | host.offload_failed                 | host | Offloads that found no host room.
host_hits                     | counter   | host.host_hits                      | host | Returning turns that loaded their prefix back from host.
host_hit_tokens               | counter   | host.host_hit_tokens                | host | Tokens loaded back from host instead of recomputed.
host_pin_expiries             | counter   | host.host_expired                   | host | Host pins released at their host TTL.
host_pin_releases             | counter   | host.host_released                  | host | Host pins released by return, last step, abort, budget or flush.
"""


def _rows(table: str) -> tuple[Series, ...]:
    rows = []
    for line in table.strip().splitlines():
        if not line.startswith("#"):
            short, kind, source, host, doc = (cell.strip() for cell in line.split(" | ", 4))
            rows.append(Series(short, kind, source, doc, host_only=host == "host"))
    return tuple(rows)


SERIES = _rows(_TABLE)

BY_SOURCE: dict[str, Series] = {s.source: s for s in SERIES}


def series_name(source: str) -> str:
    """The scraped name of the series fed by ``source`` (e.g. ``counters.hits``)."""
    return BY_SOURCE[source].name
