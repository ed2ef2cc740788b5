"""The field's protocol for recorded agents: N sessions at once, a fixed window, figures per window.

Where the serving literature measures agent traces (SGLang's AgentX recipes, ThunderAgent, MORI,
kv-cache-tester), it does not draw program arrivals from a Poisson process: it keeps **N sessions
in flight** (closed loop: a session that ends is replaced at once by the next one from the trace),
lets the system warm up, and reports throughput and TTFT over a fixed window. Past the point where
the N sessions' contexts overflow KV memory (the cliff), every turn's re-prefill and queueing show
up there, which is where a KV policy can win or lose.

- ``session_programs``: the trace as an endless stream of sessions, shuffled per pass by the seed,
  a program's later passes renamed (``id.1``, ``id.2``: each is a new session with its own tokens),
  gaps raw or capped at ``max_gap_s`` (ThunderAgent caps think time at 10 s).
- ``window_figures``: what a run did between ``warmup_s`` and ``warmup_s + window_s``, from the
  replay's records. A turn still waiting at the window's end counts with the time it had waited
  (a lower bound), and the longest waits count every turn that waited during the window, sent
  before it or in it: a policy that parks sessions cannot hide them by never serving them. A
  program's wait is its turns' waits in the window summed (a program parked at every turn boundary
  waits longer than any one of its turns shows).
  Time averages over the window say where the throughput goes: sessions admitted (first token of
  their first turn to their end), turns in the running batch (first token to finish) and their
  prompts, and returning turns waiting (sent, no first token yet).
  Clients that give up (``SessionsProtocol.client_timeout_s``): of the turns sent in the window,
  the tries that timed out, the resends, and the programs that failed because a turn timed out on
  every try (the next session took their place). A timed-out try gives its client nothing, so only
  a turn's answered try counts towards throughput; a turn's TTFT and wait count from its first
  try's send, and a turn the client gave up on waited until then.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from continuum_lab.bench.replay import ProgramRecord, ReplayResult, TurnRecord
from continuum_lab.workloads.schema import Program


@dataclass(frozen=True)
class SessionsProtocol:
    concurrency: int  # sessions in flight
    window_s: float  # measured, after the warm-up
    warmup_s: float = 600.0
    max_gap_s: Optional[float] = None  # tool/think time cap; None: raw gaps
    ramp_s: float = 60.0  # the first N sessions start evenly over this long
    # how long a client waits for a try's first token (0: forever) and how often it resends the turn
    # (``bench/replay.py``); absent from runs before clients gave up, which waited forever
    client_timeout_s: float = 0.0
    client_retries: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("sessions: the concurrency must be at least 1")
        if self.window_s <= 0 or self.warmup_s < 0 or self.ramp_s < 0:
            raise ValueError("sessions: the window must be positive, the warm-up and ramp not negative")
        if self.max_gap_s is not None and self.max_gap_s < 0:
            raise ValueError("sessions: --max-gap-s must not be negative")
        if self.client_timeout_s < 0 or self.client_retries < 0:
            raise ValueError("sessions: --client-timeout-s and --client-retries must not be negative")

    @property
    def end_s(self) -> float:
        return self.warmup_s + self.window_s

    def start_times(self) -> list[float]:
        return [i * self.ramp_s / self.concurrency for i in range(self.concurrency)]

    def to_dict(self) -> dict:
        return asdict(self)


def session_programs(programs: Sequence[Program], seed: int, max_gap_s: Optional[float] = None) -> Iterator[Program]:
    if not programs:
        raise ValueError("sessions: the workload has no programs")
    rng = random.Random(seed)
    n = 0
    while True:
        order = list(programs)
        rng.shuffle(order)
        for p in order:
            turns = p.turns
            if max_gap_s is not None:
                turns = [t.model_copy(update={"tool_duration_s": min(t.tool_duration_s, max_gap_s)}) for t in turns]
            name = p.program_id if n == 0 else f"{p.program_id}.{n}"
            yield p.model_copy(update={"program_id": name, "turns": turns})
        n += 1


def _pct(values: Sequence[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q)) if len(values) else None


def _time_mean(spans: list[tuple[float, float, float]], lo: float, hi: float) -> float:
    """The mean over ``[lo, hi)`` of the sum of weighted spans ``(start, end, weight)``."""
    return sum(w * max(0.0, min(end, hi) - max(start, lo)) for start, end, w in spans) / (hi - lo)


def _peak(spans: list[tuple[float, float, float]], lo: float, hi: float) -> float:
    """The largest sum of weighted spans ``(start, end, weight)`` at any time in ``[lo, hi)``."""
    steps = sorted(
        (t, w)
        for start, end, weight in spans
        if min(end, hi) > max(start, lo)
        for t, w in ((max(start, lo), weight), (min(end, hi), -weight))
    )  # at one time a span that ends goes before one that starts (a turn's context becomes the next's)
    level = peak = 0.0
    for _, w in steps:
        level += w
        peak = max(peak, level)
    return peak


def held_back_turns(records: Sequence[dict]) -> Optional[list[tuple[str, int]]]:
    """The turns the plugin's door held at least once, ``(program, turn index from 0)``, from its
    admission records (``bench.events.read_admission_log``): a first turn held is *parked*, a later
    one *paused*. None without records: no plugin, no door."""
    if not records:
        return None
    return sorted({(r["program_id"], r["turn"] - 1) for r in records if r.get("held_back") and r.get("program_id")})


NO_RECORD = "unknown"  # a return without the plugin's admission record (a stock policy, or a program it forgot)


def pin_ends(records: Sequence[dict]) -> Optional[list[tuple[str, int, str]]]:
    """What became of the pin before each returning turn, ``(program, turn index from 0,
    pin_end)``, from the plugin's admission records (``programs.PIN_*``). None without records."""
    if not records:
        return None
    return sorted(
        (r["program_id"], r["turn"] - 1, r["pin_end"]) for r in records if r.get("pin_end") and r.get("program_id")
    )


def _ended(program: ProgramRecord, hi: float) -> float:
    """When a program left: its end, the failure of its turn that failed, else still there at ``hi``."""
    if program.end is not None:
        return program.end
    return next((t.finish for t in program.turns if t.error is not None and t.finish is not None), hi)


def _answered_or_failed(turn: TurnRecord, hi: float) -> float:
    """When a turn's wait ended: its first token, its failure, else not by ``hi``."""
    if turn.first_token is not None:
        return turn.first_token
    return turn.finish if turn.error is not None and turn.finish is not None else hi


def window_figures(
    result: ReplayResult,
    protocol: SessionsProtocol,
    counters: Optional[dict] = None,
    held_back: Optional[Sequence[Sequence]] = None,
    pin_ended: Optional[Sequence[Sequence]] = None,
) -> dict:
    """Figures over the window. ``counters``: the engine's cumulative counters (host tokens loaded
    and written, busy seconds) at the window's start and end (``{"start": {...}, "end": {...}}``).
    ``held_back``: the turns the door held (``held_back_turns``), which add the longest park and
    pause; a turn still waiting at the window's end has no record and counts in neither.
    ``pin_ended``: what became of each returning turn's pin (``pin_ends``), which splits the
    re-prefill by it (``returns_by_pin_end``)."""
    causes = {(program_id, turn): how for program_id, turn, how in pin_ended or ()}
    by_cause: dict[str, list[int]] = {}  # pin_end -> [returns, contexts lost, tokens re-prefilled]
    lo, hi = protocol.warmup_s, protocol.end_s
    finished, sent = [], []
    # (seconds waited by the window's end or until admitted, turn index, program): turns waiting in the window
    waits: list[tuple[float, int, str]] = []
    reprefilled = 0
    admitted_spans, running, returns_waiting = [], [], []  # (start, end, weight) for the time averages
    contexts = []  # (start, end, tokens): an admitted session's context, from its turn's admission on
    for program in result.programs:
        ended = _ended(program, hi)
        if program.turns and program.turns[0].first_token is not None:
            admitted_spans.append((program.turns[0].first_token, ended, 1))
        previous = None
        for i, t in enumerate(program.turns):
            if t.first_token is not None:
                next_admitted = program.turns[i + 1].first_token if i + 1 < len(program.turns) else None
                until = ended if next_admitted is None else next_admitted
                contexts.append((t.first_token, until, t.prompt_tokens))
                if t.finish is not None:
                    contexts.append((t.finish, until, t.output_tokens))
            if t.first_token is not None and t.error is None:
                running.append((t.first_token, hi if t.finish is None else t.finish, t.prompt_tokens))
            if t.turn > 0 and t.error is None:
                returns_waiting.append((t.send, hi if t.first_token is None else t.first_token, 1))
            if lo <= t.send < hi:
                sent.append(t)
            admitted = None if t.queue_time_s is None else t.send + t.queue_time_s
            if admitted is None and t.error is not None:
                admitted = t.finish  # it waited until it failed (its client gave up)
            if t.send < hi and (admitted is None or admitted >= lo):
                waits.append(((hi if admitted is None else min(admitted, hi)) - t.send, t.turn, program.program_id))
            if t.error is None and t.finish is not None and lo <= t.finish < hi:
                finished.append(t)
                if previous is not None and previous.finish is not None:
                    context = previous.prompt_tokens + previous.output_tokens
                    lost = max(0, context - t.cached_tokens)
                    reprefilled += lost
                    tally = by_cause.setdefault(causes.get((program.program_id, t.turn), NO_RECORD), [0, 0, 0])
                    tally[0] += 1
                    tally[1] += 2 * lost > context  # most of it gone: a context lost
                    tally[2] += lost
            previous = t
    # a turn without its first token (admission) by the window's end waited at least until then,
    # one that failed first (its client gave up) until it failed
    ttft = [min(_answered_or_failed(t, hi), hi) - t.send for t in sent]
    prompt = sum(t.prompt_tokens for t in finished)
    cached = sum(t.cached_tokens for t in finished)
    host = sum(t.cached_host_tokens for t in finished)
    in_server = [t.finish - t.send for t in finished]
    program_waits: dict[str, float] = {}
    for wait, _, program_id in waits:
        program_waits[program_id] = program_waits.get(program_id, 0.0) + wait
    hours = protocol.window_s / 3600.0
    turns_running = _time_mean([(a, b, 1) for a, b, _ in running], lo, hi)
    figures = {
        "turns_finished": len(finished),
        "turns_sent": len(sent),
        "turns_failed": sum(1 for p in result.programs for t in p.turns if t.error is not None and lo <= t.send < hi),
        "output_tokens_per_s": sum(t.output_tokens for t in finished) / protocol.window_s,
        "timeouts": sum(t.timeouts for t in sent),
        "retries": sum(t.retries for t in sent),
        "failed_programs": sum(t.timed_out for t in sent),
        "turns_per_session_hour": len(finished) / (protocol.concurrency * hours),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_max_s": max(ttft, default=None),
        # first turns apart: where a policy parks programs at the door, the wait moves to them
        "ttft_p90_first_turns_s": _pct([w for w, t in zip(ttft, sent) if t.turn == 0], 90),
        "ttft_p90_later_turns_s": _pct([w for w, t in zip(ttft, sent) if t.turn > 0], 90),
        "in_server_mean_s": float(np.mean(in_server)) if in_server else None,
        "in_server_p90_s": _pct(in_server, 90),
        "prompt_tokens": prompt,
        "cached_device_tokens": cached - host,
        "cached_host_tokens": host,
        "cache_hit": cached / prompt if prompt else None,
        "host_hit": host / prompt if prompt else None,
        "reprefilled_tokens": reprefilled,
        "longest_wait_s": max((w for w, _, _ in waits), default=None),
        "longest_first_turn_wait_s": max((w for w, turn, _ in waits if turn == 0), default=None),
        "longest_later_turn_wait_s": max((w for w, turn, _ in waits if turn > 0), default=None),
        "longest_program_wait_s": max(program_waits.values(), default=None),
        "program_wait_p90_s": _pct(list(program_waits.values()), 90),
        "first_turns_waiting_at_end": sum(
            1 for p in result.programs if p.turns and p.turns[0].queue_time_s is None and p.turns[0].error is None
        ),
        "sessions_admitted_mean": _time_mean(admitted_spans, lo, hi),
        "turns_running_mean": turns_running,
        "running_turn_prompt_tokens": _time_mean(running, lo, hi) / turns_running if turns_running else None,
        "returning_turns_waiting_mean": _time_mean(returns_waiting, lo, hi),
        # what keeping every admitted session's context resident takes, on average and at the peak
        "admitted_context_tokens_mean": _time_mean(contexts, lo, hi),
        "admitted_context_tokens_peak": _peak(contexts, lo, hi),
    }
    if held_back is not None:
        held = {(program_id, turn) for program_id, turn in held_back}
        parks = [w for w, turn, pid in waits if turn == 0 and (pid, turn) in held]
        pauses = [w for w, turn, pid in waits if turn > 0 and (pid, turn) in held]
        figures["longest_park_s"] = max(parks, default=None)
        figures["longest_pause_s"] = max(pauses, default=None)
        figures["turns_paused"] = len(pauses)
    if pin_ended is not None:
        figures["returns_by_pin_end"] = {
            how: dict(zip(("returns", "lost", "tokens"), n)) for how, n in by_cause.items()
        }
    if counters is not None and "start" in counters and "end" in counters:
        start, end = counters["start"], counters["end"]
        for key in end:
            figures[f"{key}_in_window"] = end[key] - start.get(key, 0)
    return figures
