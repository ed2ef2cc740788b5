"""Every Prometheus series Continuum exports: one table that the metrics exporter, the benchmark
reports and ``docs/metrics.md`` all use (``tests/unit/test_series.py`` checks that page against it).

``source`` names where the value lives: ``counters.<field>`` (``PinCounters``),
``host.<field>`` (``HostCounters``), ``admission.<field>`` (``AdmissionCounters``),
``programs.<field>`` (``ProgramCounters``), ``sheds.<field>`` (``ShedCounters``),
``identity.<field>`` (``IdentityCounters``), ``holds.<field>`` (``residency.Holds``),
``saver.<field>`` (``StatsSaver``), or ``gauge.<name>`` (computed by the exporter).

Rows that share a name are one family, its children told apart by a label (``reason=alloc``):
one fact, one name, so ``sum by (reason)`` and a share of the whole are one expression.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "sglang:continuum_"
# on every series: one per scheduler (under --dp-size N every rank's scheduler is tp_rank 0)
BASE_LABELS = ("model_name", "tp_rank", "dp_rank")


@dataclass(frozen=True, slots=True)
class Series:
    short: str  # name without the prefix (and without _total for counters)
    kind: str  # "gauge" | "counter" | "histogram"
    source: str
    doc: str
    host_only: bool = False  # exported only with HiCache
    label: str = ""  # "reason=alloc": this row is one child of its family; "": the family is this row

    @property
    def name(self) -> str:
        """The name a scrape shows (counters end in _total)."""
        return PREFIX + self.short + ("_total" if self.kind == "counter" else "")

    @property
    def label_name(self) -> str:
        return self.label.partition("=")[0]

    @property
    def label_value(self) -> str:
        return self.label.partition("=")[2]

    @property
    def key(self) -> str:
        """The series as ``parse_metrics`` keys it: the name, and a child's label (the name
        alone sums the family's children)."""
        return f'{self.name}{{{self.label_name}="{self.label_value}"}}' if self.label else self.name


# name (without the prefix) | kind | source | label | host only | what it counts or measures
_TABLE = """
# gauges
info                          | gauge     | info                                | -                      | -    | 1 per scheduler, labelled with the plugin's version and its key settings.
pinned_programs               | gauge     | gauge.pinned_programs               | -                      | -    | Programs whose prefix is TTL-pinned.
pinned_tokens                 | gauge     | gauge.pinned_tokens                 | -                      | -    | Tokens held by TTL pins (path lengths).
pin_budget_tokens             | gauge     | gauge.pin_budget_tokens             | -                      | -    | Most tokens pins may hold.
kv_pool_tokens                | gauge     | gauge.kv_pool_tokens                | -                      | -    | Tokens the device KV pool holds (SGLang's max_total_num_tokens, the denominator of its token_usage).
kv_request_tokens             | gauge     | gauge.kv_request_tokens             | -                      | -    | KV tokens held for requests (running, or prefilled in chunks): what SGLang's kv_used_tokens would read without pins. Over kv_pool_tokens, the pool's real occupancy: alert and autoscale on it, not on token_usage, which pins keep near 1 by design.
kv_pinned_reclaimable_tokens  | gauge     | gauge.kv_pinned_reclaimable_tokens  | -                      | -    | KV tokens only pins hold (no running request shares them): counted as used by SGLang, given back to waiting turns by shedding pins.
tracked_programs              | gauge     | gauge.tracked_programs              | -                      | -    | Programs the registry remembers.
programs_in_flight            | gauge     | gauge.programs_in_flight            | -                      | -    | Programs in the working set (a turn waiting or running, or out on a tool while pinned, or with HiCache while seen in the last 120 s).
critical_programs             | gauge     | gauge.critical_programs             | -                      | -    | Programs in flight that their client marked on their multi-agent application's critical path (`critical`).
critical_reserve_tokens       | gauge     | gauge.critical_reserve_tokens       | -                      | -    | The share of the capacity reserved for critical programs (it grows while the working set fills the capacity, shrinks while it does not; 0 without critical programs): what they do not use of it, the rest may not.
working_set_tokens            | gauge     | gauge.working_set_tokens            | -                      | -    | Current context tokens of programs in flight.
working_set_reserved_tokens   | gauge     | gauge.working_set_reserved_tokens   | -                      | -    | Tokens admission control keeps for programs in flight: each at least the expected final context while growth is reserved.
growth_reserved               | gauge     | gauge.growth_reserved               | -                      | -    | 1 while admission control reserves room for programs to grow to the expected final context; 0 where the engine's price says a lost context is cheaper to rebuild (by a prefill) than the batch place its room would hold; with a host tier the door then holds no first turn.
decode_share_ratio            | gauge     | gauge.decode_share_ratio            | -                      | -    | Share of the engine's busy time spent in decode steps (decayed over a minute of engine time; 1 until a second of it is seen): what a place left empty in the batch costs, which prices keeping a program resident (no host tier) and reserving room for growth.
prefill_step_seconds          | gauge     | gauge.prefill_step_seconds          | -                      | -    | The engine's prefill cost per step, c0 (fitted to the scheduler's prefill steps as c0 + c1 * tokens + c2 * pairs, decayed over a minute of engine time; 0 until 4,096 tokens in 8 steps are seen): what re-prefilling a lost context costs where no measured prefill profile is configured.
prefill_seconds_per_token     | gauge     | gauge.prefill_seconds_per_token     | -                      | -    | The engine's prefill cost per new token, c1 (fitted to the scheduler's prefill steps as c0 + c1 * tokens + c2 * pairs, decayed over a minute of engine time; 0 until 4,096 tokens in 8 steps are seen): what re-prefilling a lost context costs where no measured prefill profile is configured.
prefill_seconds_per_pair      | gauge     | gauge.prefill_seconds_per_pair      | -                      | -    | The engine's prefill cost per attention token pair (e^2 + 2ep for e new tokens behind p cached), c2 (fitted to the scheduler's prefill steps as c0 + c1 * tokens + c2 * pairs, decayed over a minute of engine time; 0 until 4,096 tokens in 8 steps are seen): what re-prefilling a lost context costs where no measured prefill profile is configured.
expected_final_context_tokens | gauge     | gauge.expected_final_context_tokens | -                      | -    | Mean final context of the last 64 programs that ended (0 before any did).
programs_held_back            | gauge     | gauge.programs_held_back            | -                      | -    | Waiting first turns of new programs that admission control is holding back.
return_loss_ratio             | gauge     | gauge.return_loss_ratio             | -                      | -    | Share of returning programs' previous contexts found gone (last 32 returning turns): the thrash signal.
release_loss_ratio            | gauge     | gauge.release_loss_ratio            | -                      | -    | Share of their previous contexts that programs let go unpinned at their turn's end found gone when they came back (last 32 of them; 1 until 8 are seen): what letting a context go loses, which prices keeping a program resident (no host tier).
overtake_budget               | gauge     | gauge.overtake_budget               | -                      | -    | Later arrivals that may be admitted ahead of a returning turn entering the queue now before it is overdue, in average prompts prefilled (max_overtakes, down to 2 as the return loss passes 0.5; a first turn keeps max_overtakes; 0: no bound).
oldest_wait_seconds           | gauge     | gauge.oldest_wait_seconds           | -                      | -    | How long the oldest waiting request has waited.
longest_hold_seconds          | gauge     | gauge.longest_hold_seconds          | -                      | -    | How long the longest-waiting turn that admission control held (a first turn or a paused return), not yet admitted, has waited; max_hold_s bounds it, plus the time to free room once it is due.
# pin counters
pins_created                  | counter   | counters.created                    | -                      | -    | Pins created after a non-final turn.
pin_hits                      | counter   | counters.hits                       | -                      | -    | Next turns admitted while their pin held the prefix.
pin_expiries                  | counter   | counters.expired                    | -                      | -    | Pins released at their deadline.
pins_refused                  | counter   | counters.refused                    | -                      | -    | Pins not created: budget held by earlier programs.
pin_releases                  | counter   | counters.released                   | -                      | -    | Pins released by last step, abort, retraction, replacement or a forgotten program.
pins_flushed                  | counter   | counters.flushed                    | -                      | -    | Pins dropped with the whole cache by /flush_cache.
# pins shed, by reason (summed over reason: every pin shed)
pin_sheds                     | counter   | sheds.admission                     | reason=admission       | -    | Pins of programs ranked after a blocked turn, shed so it could be admitted.
pin_sheds                     | counter   | sheds.idle                          | reason=idle            | -    | Pins of any rank shed for a blocked turn because the engine would otherwise idle.
pin_sheds                     | counter   | sheds.hold_bound                    | reason=hold_bound      | -    | Pins of any rank shed for a blocked turn whose hold bound passed: resident programs released, each to take its own turn (one rebuild each: what the bound costs).
pin_sheds                     | counter   | sheds.gap                           | reason=gap             | -    | Pins of any rank shed for a blocked turn because their program's tool call leaves time to serve it: to host and back before the return (HiCache; Tokencake's Algorithm 1).
pin_sheds                     | counter   | sheds.alloc                         | reason=alloc           | -    | Pins shed because an allocation would otherwise fail.
pin_sheds                     | counter   | sheds.budget                        | reason=budget          | -    | Pins of later programs shed for an earlier one's pin.
pin_sheds                     | counter   | sheds.stale                         | reason=stale           | -    | Pins shed first, whatever their rank and whatever needed the room, because their program (whose client announces no ends) stayed away past its own pace.
pin_sheds_while_waiting       | counter   | sheds.while_waiting                 | -                      | -    | Pins shed while their program's next turn was already waiting (a certain hit thrown away).
pin_sheds_returned            | counter   | sheds.returned                      | -                      | -    | Programs that came back after their pin was shed (the cost model's pin survival reads it).
# admission
held_back_requests            | counter   | admission.held_back                 | -                      | -    | Turns admission control kept waiting (once per request): new programs' first turns and paused returns.
programs_paused               | counter   | admission.paused                    | -                      | -    | Of them, returns that found their context gone and were paused at a turn boundary until the working set left them room (no host tier).
holds_due                     | counter   | holds.came_due                      | -                      | -    | Held turns whose hold bound (max_hold_s from their arrival) passed: no longer held, admitted next.
requests_admitted             | counter   | admission.admitted                  | -                      | -    | Requests admitted.
overdue_admitted              | counter   | admission.overdue_admitted          | -                      | -    | Requests that were overdue (overtaken as many times as their budget) when admitted.
# how programs ended, by reason
programs_ended                | counter   | programs.last_step                  | reason=last_step       | -    | A turn flagged last step.
programs_ended                | counter   | programs.terminal_tool              | reason=terminal_tool   | -    | A turn that called a terminal tool (terminal_tools, e.g. a submit).
programs_ended                | counter   | programs.released                   | reason=closed          | -    | The client closed it after the fact (/close_session with the program id).
programs_ended                | counter   | programs.forgotten                  | reason=forgotten       | -    | Forgotten idle or by the registry bound.
programs_ended                | counter   | programs.presumed_ended             | reason=presumed_ended  | -    | Its client announces no ends, and it stayed away past its own return horizon: presumed ended.
programs_refused              | counter   | programs.refused                    | -                      | -    | New program ids turned away by the full registry (every program it could drop has a turn in flight or a pin): their turns are served as without an id until room frees.
programs_presumed_returned    | counter   | programs.presumed_returned          | -                      | -    | Programs presumed ended that came back after all (served as new programs).
programs_not_returned         | counter   | programs.not_returned               | -                      | -    | Programs that ended while out on a tool call (lowers that tool's return probability).
programs_single_shot          | counter   | programs.single_shot                | -                      | -    | Would-be programs dropped: a request with no id, taken as a new program's first turn, that nothing continued within the horizon first turns are watched for (its pin released).
# where each request's program id came from (docs/program-identity.md)
requests                      | counter   | identity.program_id                 | id_source=program_id   | -    | custom_params.program_id (or job_id).
requests                      | counter   | identity.session_id                 | id_source=session_id   | -    | SGLang's session_id.
requests                      | counter   | identity.routing_key                | id_source=routing_key  | -    | SGLang's routing key (X-SMG-Routing-Key).
requests                      | counter   | identity.inferred                   | id_source=inferred     | -    | No id: attributed to a program from its prefix (infer_programs).
requests                      | counter   | identity.first_turn                 | id_source=first_turn   | -    | No id, continuing nothing: taken as a new program's first turn (most such requests lately were continued).
requests                      | counter   | identity.none                       | id_source=none         | -    | No program: served as under fcfs.
# routing: did each program's turns reach one worker? (needs the client's step numbers)
programs_seen                 | counter   | programs.seen                       | -                      | -    | Programs whose first turn seen here was new to this worker.
programs_affine               | counter   | programs.affine                     | -                      | -    | Programs that ended here (last step with its step number N) after turns 1..N all arrived here.
programs_split                | counter   | programs.split                      | -                      | -    | Programs that ended here (last step with its step number) after some turns went to another worker.
# tool statistics shared between workers (stats_publish_endpoint / stats_peer_endpoints)
stats_samples_sent            | counter   | exchange.sent                       | -                      | -    | Tool-statistics samples published to peers.
stats_samples_received        | counter   | exchange.received                   | -                      | -    | Peers' tool-statistics samples merged here.
stats_samples_dropped         | counter   | exchange.dropped                    | -                      | -    | Samples not shared: outbox full, or the publish queue full (a slow or dead peer).
stats_peers                   | gauge     | gauge.stats_peers                   | -                      | -    | Peers heard from within the last 5 seconds.
# statistics persistence
stats_saves                   | counter   | saver.saved                         | -                      | -    | Tool statistics written to stats_path.
stats_save_failures           | counter   | saver.failures                      | -                      | -    | Failed statistics writes (serving continues).
# histogram
ttl_seconds                   | histogram | ttl                                 | -                      | -    | TTL chosen per pin decision.
hold_seconds                  | histogram | holds                               | -                      | -    | Wait of each turn admission control held, from its arrival to its admission, labelled turn="first_turn" (a new program's first turn) or turn="pause" (a return paused at its turn boundary).
# host tier (HiCache)
host_pinned_programs          | gauge     | gauge.host_pinned_programs          | -                      | host | Programs whose host copy is protected.
host_pinned_tokens            | gauge     | gauge.host_pinned_tokens            | -                      | host | Host tokens protected by host pins.
host_load_seconds_per_token   | gauge     | gauge.host_load_seconds_per_token   | -                      | host | The engine's cost per token loaded back from host, c3 (a fourth term of the prefill fit, c3 * loaded, on the steps whose selection loaded host KV; 0 until 4,096 loaded tokens in 4 steps are seen): what a reload costs where no host bandwidth is measured (host_bandwidth_bytes_per_s or the prefill profile's); a copy the forward hides costs 0.
offloads                      | counter   | host.offloaded                      | -                      | host | Expired or shed pins whose prefix went to a protected host copy.
offload_failures              | counter   | host.offload_failed                 | -                      | host | Offloads that found no host room.
host_hits                     | counter   | host.host_hits                      | -                      | host | Returning turns that loaded their prefix back from host.
host_hit_tokens               | counter   | host.host_hit_tokens                | -                      | host | Tokens loaded back from host instead of recomputed.
host_pin_expiries             | counter   | host.host_expired                   | -                      | host | Host pins released at their host TTL.
host_pin_releases             | counter   | host.host_released                  | -                      | host | Host pins released by return, last step, abort, budget or flush.
host_load_wait_seconds        | counter   | host.load_wait_s                    | -                      | host | What returning turns' own prefill steps paid for the prefixes they loaded back from host (the reload cost of those tokens): the wait predictive upload removes.
uploads                       | counter   | uploads.started                     | outcome=started        | host | Host copies loaded back to the device ahead of their program's predicted return (predictive upload).
uploads                       | counter   | uploads.used                        | outcome=used           | host | Uploads whose program's next turn was admitted while the upload held its prefix on the device.
uploads                       | counter   | uploads.wasted                      | outcome=wasted         | host | Uploads released (deadline, shed, end) before their program came back.
uploads                       | counter   | uploads.failed                      | outcome=failed         | host | Uploads SGLang would not start (nothing on host, no device room without evicting).
upload_tokens                 | counter   | uploads.tokens                      | -                      | host | Tokens uploaded ahead of their program's return.
"""

# The help text of each family whose children a label tells apart (each child's is its row's).
FAMILY_HELP = {
    "pin_sheds": "Pins released early to make room, by reason (summed over reason: every pin shed).",
    "programs_ended": "Programs that ended, by reason.",
    "uploads": "Host copies loaded back to the device ahead of their program's return, by outcome.",
    "requests": "Arriving requests, by where their program id came from.",
}

# Counter fields with no series of their own: a family's sum says the same.
NOT_EXPORTED = {
    "counters.shed": "sum of pin_sheds_total over reason",
    "admission.admission_sheds": "pin_sheds_total with reason admission, idle or hold_bound, and stale pins shed for a blocked turn",
}


def _rows(table: str) -> tuple[Series, ...]:
    rows = []
    for line in table.strip().splitlines():
        if not line.startswith("#"):
            short, kind, source, label, host, doc = (cell.strip() for cell in line.split(" | ", 5))
            rows.append(Series(short, kind, source, doc, host_only=host == "host", label="" if label == "-" else label))
    return tuple(rows)


SERIES = _rows(_TABLE)

BY_SOURCE: dict[str, Series] = {s.source: s for s in SERIES}

# the labels that tell a family's children apart (``parse_metrics`` keys each child by it)
CHILD_LABELS = tuple(sorted({s.label_name for s in SERIES if s.label}))


def _families(series: tuple[Series, ...]) -> dict[str, tuple[Series, ...]]:
    out: dict[str, list[Series]] = {}
    for s in series:
        out.setdefault(s.short, []).append(s)
    return {short: tuple(rows) for short, rows in out.items()}


# each exported name's rows, in table order (a plain series is a family of one)
FAMILIES = _families(SERIES)


def help_text(short: str) -> str:
    """A family's Prometheus HELP: its own text, or its single row's."""
    return FAMILY_HELP.get(short) or FAMILIES[short][0].doc


def series_name(source: str) -> str:
    """The scraped name of the series fed by ``source`` (e.g. ``counters.hits``); a family's
    child shares its family's name (summed over the label)."""
    return BY_SOURCE[source].name


def series_key(source: str) -> str:
    """The key ``parse_metrics`` gives the series fed by ``source``: a family's child with its
    label (``sglang:continuum_pin_sheds_total{reason="alloc"}``)."""
    return BY_SOURCE[source].key


def family_name(short: str) -> str:
    """The scraped name of the family ``short`` (``pin_sheds``: every pin shed, all reasons)."""
    return FAMILIES[short][0].name
