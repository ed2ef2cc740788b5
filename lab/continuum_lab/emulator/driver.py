"""Closed-loop agent driver in virtual time: the replay client's contract, without a server.

Programs arrive as the same seeded Poisson process as ``bench/replay.py`` (``arrival_times``; at
rate 0 all at once: an RL rollout step, ``continuum-bench --rollout``), or (``run_sessions``, the
field's protocol in ``bench/sessions.py``) N sessions stay in flight for a fixed window, a
finished one replaced at once by the next, or (``run_applications``) multi-agent applications
arrive at that rate, each agent a program started when its dependencies have ended
(``bench/applications.py``). A program sends its first turn on arrival; each later
turn is sent when the previous one finished plus that turn's tool duration; the last turn carries
``is_last_step``. Between sends the real scheduler steps, and every step moves the virtual clock
by the profile's latency for the batch it ran. Nothing reads wall time, so the same inputs give
the same records.

Records are the replay client's (``TurnRecord``/``ProgramRecord``/``ReplayResult``), so the bench's
reports and plots read emulated runs unchanged. ``queue_time_s`` is the time from send to the
step that first admitted the turn into a prefill batch.

Clients give up as the replay client's do (``client_timeout_s``, ``client_retries``): a try's
deadline for its first token is an event in the heap. Past it with no first token (or with one
that came only after it), the client aborts the request in the scheduler, as a client that closes
its connection makes SGLang do (``engine.abort``), and sends the turn again under a new rid
(``attribution.retry_rid``), or, its retries spent, fails its program; in ``run_sessions`` the
next session then takes its place.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from continuum_lab.bench.applications import AgentStarts
from continuum_lab.bench.attribution import retry_rid
from continuum_lab.bench.replay import (
    IDENTITIES,
    ProgramRecord,
    ReplayResult,
    TurnRecord,
    arrival_times,
    hinted,
    program_seed,
    shared_prompt_key,
    timeout_error,
)
from continuum_lab.emulator import sglang_engine as engine
from continuum_lab.emulator.step_model import StepLatencyModel
from continuum_lab.harness import inprocess as loop  # SGLang's scheduler loop, step by step
from continuum_lab.workloads.schema import Program
from sglang_continuum.client import continuum_custom_params
from sglang_continuum.core.clock import ManualClock

IDLE_TICK_S = 0.005  # how far time moves while requests wait and nothing can run (pins expiring)
MAX_IDLE_WITH_WORK_S = 600.0  # that long with work queued and nothing run: the scheduler is wedged


class SchedulerWedged(RuntimeError):
    pass


def _token_rng(seed: int, program_id: str) -> np.random.Generator:
    return np.random.default_rng(program_seed(seed, program_id))


class _Program:
    __slots__ = ("index", "spec", "record", "rng", "context", "next_turn")

    def __init__(self, index: int, spec: Program, record: ProgramRecord, rng: np.random.Generator) -> None:
        self.index = index  # in the workload: what the event heap carries
        self.spec = spec
        self.record = record
        self.rng = rng
        self.context: list[int] = []
        self.next_turn = 0


class _Try:
    """A turn's request in the scheduler, and its client's deadline for the first token."""

    __slots__ = ("program", "record", "req", "deadline")

    def __init__(self, program: _Program, record: TurnRecord, req, deadline: float) -> None:
        self.program = program
        self.record = record
        self.req = req
        self.deadline = deadline  # inf: the client waits forever


class ClosedLoopDriver:
    def __init__(
        self,
        scheduler,
        latency: StepLatencyModel,
        clock: ManualClock,
        *,
        seed: int = 0,
        vocab: int = 1000,
        identity: str = "ids",
        close_sessions: bool = False,
        on_turn: Optional[Callable[[TurnRecord], None]] = None,
        host: Optional[engine.HostTransfers] = None,
        marks: Sequence[float] = (),
        on_mark: Optional[Callable[[float], None]] = None,
        client_timeout_s: float = 0.0,
        client_retries: int = 0,
        kv_every_s: float = 0.0,
    ) -> None:
        if vocab > engine.ACCOUNTING_VOCAB:
            raise ValueError(f"vocab {vocab} exceeds the accounting model's {engine.ACCOUNTING_VOCAB}")
        self.s = scheduler
        self.latency = latency
        self.clock = clock
        self.seed = seed
        self.vocab = vocab
        if identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {IDENTITIES}")
        self.identity = identity
        self.send_program_id = identity == "ids"
        self.close_sessions = close_sessions
        self.on_turn = on_turn
        if client_timeout_s < 0 or client_retries < 0:
            raise ValueError("the client timeout and retries must not be negative")
        self.client_timeout_s = client_timeout_s  # for a try's first token; 0: wait forever
        self.client_retries = client_retries
        self.busy_s = 0.0
        self.host = host  # HiCache's transfers (None without it)
        self.host_load_s = 0.0  # of busy_s: prefill steps waiting for KV loaded back from host
        self.prefill_s = 0.0  # of busy_s: prefill steps (their host loads included)
        self._marks = sorted(marks)  # seconds after the start: ``on_mark`` at the first step past each
        self.on_mark = on_mark
        self.steps = {"prefill": 0, "decode": 0, "idle_ticks": 0}
        # (time, seq, program index, None) a send; (time, seq, -1, rid) a try's first-token deadline
        self._events: list[tuple[float, int, int, Optional[str]]] = []
        self._seq = 0
        self._inflight: dict[str, _Try] = {}
        self._states: list[_Program] = []
        self._sessions: Optional[Iterator[Program]] = None  # the next sessions (run_sessions)
        self.counters_at: dict[float, dict] = {}  # mark -> cumulative counters then
        self.hints: Optional[dict[str, dict]] = None  # program id -> its application hints (``hinted``)
        self.tool_times = False  # every turn hints its tool time (``hinted``)
        self.on_program_end: Optional[Callable[[Program, float], None]] = None  # (program, when) as it ends
        self.kv_every_s = kv_every_s  # > 0: sample the KV pool's use this often (virtual s)
        self.kv_samples: list[list[float]] = []  # [t, used share, occupied share] (``_sample_kv``)
        self._next_kv = 0.0

    # -- events ---------------------------------------------------------------------------
    def _schedule(self, at: float, index: int, rid: Optional[str] = None) -> None:
        heapq.heappush(self._events, (at, self._seq, index, rid))
        self._seq += 1

    def _send(self, program: _Program, at: float) -> None:
        spec, i = program.spec, program.next_turn
        turn = spec.turns[i]
        key = shared_prompt_key(spec, i)  # a rollout group's first prompt: the group's ids
        draw = program.rng if key is None else _token_rng(self.seed, key)
        program.context.extend(draw.integers(5, self.vocab, turn.append_tokens).tolist())
        rec = TurnRecord(spec.program_id, i, send=at, prompt_tokens=len(program.context))
        if i == 0:
            program.record.start = at
        program.record.turns.append(rec)
        self._submit(program, rec, at)

    def _submit(self, program: _Program, rec: TurnRecord, at: float) -> None:
        """The turn's try number ``rec.retries``, sent at ``at``."""
        spec, i = program.spec, rec.turn
        turn = spec.turns[i]
        last = i == len(spec.turns) - 1
        custom = (
            continuum_custom_params(
                spec.program_id,
                last_step=last,
                tool_name=turn.tool,
                step=i + 1,
                **hinted(self.hints, spec, i, tool_times=self.tool_times),
            )
            if self.send_program_id
            else None
        )
        rid = retry_rid(spec.program_id, i, rec.retries)
        req = engine.submit(
            self.s,
            rid,
            program.context,
            turn.output_tokens,
            custom,
            spec.program_id if self.send_program_id else None,
            spec.program_id if self.identity == "routing-key" else None,
        )
        deadline = at + self.client_timeout_s if self.client_timeout_s else math.inf
        self._inflight[rid] = _Try(program, rec, req, deadline)
        if self.client_timeout_s:
            self._schedule(deadline, -1, rid)

    def _awaits_first_token(self, rid: str) -> bool:
        attempt = self._inflight.get(rid)
        return attempt is not None and attempt.record.first_token is None

    def _drop_stale_deadlines(self) -> None:
        """Deadlines of tries that got their first token, or ended, are no events: the loop must
        neither wait for them nor run past the last turn for them."""
        while self._events and self._events[0][3] is not None and not self._awaits_first_token(self._events[0][3]):
            heapq.heappop(self._events)

    def _time_out(self, rid: str, at: float) -> None:
        """The client gave up on try ``rid`` at ``at``: it aborts the request, then sends the turn
        again, or (its retries spent) fails the program."""
        attempt = self._inflight.pop(rid)
        engine.abort(self.s, rid)
        rec = attempt.record
        rec.timeouts += 1
        rec.forget_try()
        if rec.retries < self.client_retries:
            rec.retries += 1
            self._submit(attempt.program, rec, at)
            return
        rec.finish = at
        rec.error = timeout_error(self.client_timeout_s, rec.timeouts)
        self._fail(attempt.program, rec, at)

    def _fail(self, program: _Program, rec: TurnRecord, at: float) -> None:
        """As the replay client: the turn failed, its program stops (not ok)."""
        program.context = []
        if self.on_turn is not None:
            self.on_turn(rec)
        if self._sessions is not None:
            self._start(next(self._sessions), at)

    def _finished(self, rid: str, now: float) -> None:
        attempt = self._inflight.pop(rid)
        program, rec, req = attempt.program, attempt.record, attempt.req
        rec.finish = now
        error = engine.abort_message(req)
        if error is not None:
            rec.error = f"aborted by the scheduler: {error}"[:300]
            self._fail(program, rec, now)
            return
        rec.output_tokens = len(req.output_ids)
        rec.cached_tokens = int(req.cached_tokens)
        rec.cached_host_tokens = int(req.cached_tokens_host)  # SGLang's own split, as a server reports it
        if rec.first_token is None:
            rec.first_token = now
        if self.on_turn is not None:
            self.on_turn(rec)
        program.context.extend(req.output_ids)
        turn = program.spec.turns[program.next_turn]
        program.next_turn += 1
        if program.next_turn < len(program.spec.turns):
            self._schedule(now + turn.tool_duration_s, program.index)
        else:
            program.record.end = now
            program.context = []  # the driver keeps no finished context
            if self.close_sessions and self.send_program_id:
                engine.close_session(self.s, program.spec.program_id)
            if self.on_program_end is not None:
                self.on_program_end(program.spec, now)
            if self._sessions is not None:
                self._start(next(self._sessions), now)

    def _start(self, spec: Program, at: float) -> None:
        index = len(self._states)
        self._states.append(
            _Program(index, spec, ProgramRecord(spec.program_id, at), _token_rng(self.seed, spec.program_id))
        )
        self._schedule(at, index)

    def counters(self) -> dict:
        """The engine's cumulative counters (a window's figures are their differences)."""
        out = {"busy_s": self.busy_s, "prefill_s": self.prefill_s, "prefill_steps": self.steps["prefill"],
               "decode_steps": self.steps["decode"]}  # fmt: skip
        if self.host is not None:
            out |= {"host_loaded_tokens": self.host.loaded_tokens, "host_written_tokens": self.host.written_tokens,
                    "host_load_s": self.host_load_s}  # fmt: skip
        return out

    # -- the loop -------------------------------------------------------------------------
    def run(self, programs: list[Program], jps: float, until: Optional[float] = None) -> ReplayResult:
        """Programs arrive as a Poisson process (``jps`` 0: all at once); returns when every one
        has finished, or once the clock passes ``until`` seconds (turns then in flight are left
        unfinished, as ``run_sessions`` leaves them)."""
        for p, a in zip(programs, arrival_times(len(programs), jps, self.seed)):
            self._start(p, a)
        return self._run_started(until)

    def run_applications(self, apps, aps: float, *, hints: bool = False) -> ReplayResult:
        """Multi-agent applications (``workloads/applications.py``) arriving as a Poisson process
        at ``aps``: an agent is a program started when its dependencies have ended
        (``bench/applications.AgentStarts``); returns when every started agent has ended."""
        starts = AgentStarts(apps, aps, self.seed)
        if hints:
            self.hints = starts.hints

        def start_dependents(spec: Program, at: float) -> None:
            for ready in starts.ended(spec.program_id):
                self._start(ready, at)

        self.on_program_end = start_dependents
        for at, program in starts.roots():
            self._start(program, at)
        return self._run_started(None)

    def _run_started(self, until: Optional[float]) -> ReplayResult:
        start = self.clock()
        self._loop(start, until=None if until is None else start + until)
        self._drop_stale_deadlines()
        if self._inflight or self._events:
            if until is not None:
                return self._result(start)
            raise SchedulerWedged(f"{len(self._inflight)} requests never finished")
        # one idle iteration after the last turn, as a server has (metrics, self-check)
        assert loop.select_batch(self.s) is None, "an idle scheduler selected a batch"
        loop.end_iteration(self.s, None, None, idle=True)
        return self._result(start)

    def run_sessions(
        self, sessions: Iterator[Program], concurrency: int, start_times: Sequence[float], until: float
    ) -> ReplayResult:
        """``concurrency`` sessions in flight from ``start_times``, each replaced by the next of
        ``sessions`` when it ends; stops when the clock passes ``until`` (turns then in flight are
        left as they are: the figures count them as waiting)."""
        self._sessions = sessions
        for at in start_times[:concurrency]:
            self._start(next(sessions), at)
        start = self.clock()
        self._loop(start, until=start + until)
        return self._result(start)

    def _result(self, start: float) -> ReplayResult:
        records = [p.record for p in self._states]
        return ReplayResult(records, self.clock() - start, client_timeout_s=self.client_timeout_s,
                            client_retries=self.client_retries)  # fmt: skip

    def _loop(self, start: float, until: Optional[float]) -> None:
        """SGLang's scheduler loop in virtual time. Without overlap (``event_loop_normal``) a
        batch is selected, its forward's time passes, its results are processed. With overlap
        (``event_loop_overlap``, a server's default) each iteration selects and launches a batch,
        then processes the results of the one launched before it. On a GPU the launch returns at
        once, so the next selection runs while the new forward does; on a CPU
        (``synchronous_forward``) the launch returns when the forward is done, and the results of
        the batch before it go out one forward late."""
        overlap = loop.begin_loop(self.s)
        synchronous = self.latency.synchronous_forward
        in_flight: Optional[_Launched] = None
        idle_with_work = 0.0
        while until is None or self.clock() < until:
            now = self.clock()
            self._observe(now - start)
            self._drop_stale_deadlines()
            while self._events and self._events[0][0] <= now:
                at, _, index, rid = heapq.heappop(self._events)
                if rid is None:
                    self._send(self._states[index], at)
                elif self._awaits_first_token(rid):
                    self._time_out(rid, at)
            self._drop_stale_deadlines()
            batch = loop.select_batch(self.s)
            if batch is None and in_flight is None:
                loop.end_iteration(self.s, None, None, idle=True)
                if engine.is_idle(self.s) and not self._inflight:
                    if not self._events:
                        break
                    next_send = self._events[0][0] if until is None else min(self._events[0][0], until)
                    self.clock.advance(max(next_send - now, 0.0))  # nothing to do until the next send
                    # An idle server's loop keeps spinning, so the plugin's step clock is current
                    # when the request arrives; without this iteration the arrival would be stamped
                    # with the last busy step's time and every tool time measured as ~one step.
                    batch = loop.select_batch(self.s)
                    assert batch is None, "an idle scheduler selected a batch"
                    loop.end_iteration(self.s, None, None, idle=True)
                    idle_with_work = 0.0
                    continue
                # work is queued but nothing ran (e.g. waiting for memory a pin releases on expiry)
                tick = IDLE_TICK_S if not self._events else min(IDLE_TICK_S, self._events[0][0] - now)
                self.clock.advance(max(tick, 1e-6))
                self.steps["idle_ticks"] += 1
                idle_with_work += tick
                if idle_with_work > MAX_IDLE_WITH_WORK_S:
                    raise SchedulerWedged(
                        f"{len(self.s.waiting_queue)} requests waited {idle_with_work:.0f} s of virtual time "
                        "with nothing running"
                    )
                continue
            idle_with_work = 0.0
            launched = None
            if batch is not None:
                if in_flight is not None and loop.processes_before_launch(self.s, batch):
                    self._complete(in_flight)
                    in_flight = None
                launched = self._launch(batch, now, after=in_flight.end if in_flight is not None else now)
                if overlap and synchronous:
                    self._run_forward(launched)
            if in_flight is not None:
                self._complete(in_flight)
            if not overlap and launched is not None:
                self._complete(launched)
                launched = None
            loop.end_iteration(self.s, batch, launched.entry if launched else None, idle=False)
            in_flight = launched

    def _observe(self, t: float) -> None:
        """``t`` s after the start: the marks it passed (``on_mark``), and a KV sample when one is due."""
        while self._marks and t >= self._marks[0]:
            mark = self._marks.pop(0)
            self.counters_at[mark] = self.counters()
            if self.on_mark is not None:
                self.on_mark(mark)
        if self.kv_every_s and t >= self._next_kv:
            self._sample_kv(t)

    def _sample_kv(self, t: float) -> None:
        """The pool's share held by requests and pins (SGLang's ``token_usage``: neither free nor
        evictable) and its share holding any KV (evictable cache too)."""
        pool = engine.pool_accounting(self.s)
        total = max(1, pool["total"])
        used = (total - pool["available"] - pool["evictable"]) / total
        self.kv_samples.append([round(t, 3), round(used, 4), round((total - pool["available"]) / total, 4)])
        self._next_kv = t + self.kv_every_s

    def _launch(self, batch, now: float, after: float) -> "_Launched":
        """Launch ``batch`` (selected at ``now``); its forward starts once the one in flight
        ends (``after``) and takes the profile's time for its shape."""
        shape = engine.describe_batch(batch)
        if shape.is_prefill:
            dt = self.latency.prefill_seconds(shape.extends)
            if self.host is not None:
                # loads queued since the last prefill (this batch's load back, a predictive
                # reload): this batch waits on their layer events before reading that KV
                load_s = self.latency.host_load_seconds(self.host.take_unbilled())
                dt += load_s
                self.host_load_s += load_s
            self.steps["prefill"] += 1
            for req in batch.reqs:
                attempt = self._inflight.get(req.rid)
                if attempt is not None and attempt.record.queue_time_s is None:
                    attempt.record.queue_time_s = now - attempt.record.send  # from the first try's send
            self.prefill_s += dt
        else:
            dt = self.latency.decode_seconds(shape.batch_size, shape.context_tokens)
            self.steps["decode"] += 1
        self.busy_s += dt
        return _Launched(loop.launch(self.s, batch), max(now, after), dt)

    def _run_forward(self, launched: "_Launched") -> None:
        """The forward's time passes."""
        if launched.start > self.clock():  # it waited for the forward before it
            self.clock.advance(launched.start - self.clock())
        self.clock.advance(launched.seconds)
        launched.ran = True

    def _complete(self, launched: "_Launched") -> None:
        """Its forward's time passes (if it has not), then its results are processed."""
        if not launched.ran:
            self._run_forward(launched)
        loop.process(self.s, launched.entry)
        done = self.clock()
        for req in launched.entry[0].reqs:
            attempt = self._inflight.get(req.rid)
            if attempt is None:  # finished, or its client gave up on it
                continue
            if attempt.record.first_token is None and len(req.output_ids) > 0:
                if done > attempt.deadline:  # after its client gave up: the deadline's event times the try out
                    continue
                attempt.record.first_token = done
            if req.finished():
                self._finished(req.rid, done)


class _Launched:
    """A batch whose forward was launched and whose results are not processed yet."""

    __slots__ = ("entry", "start", "seconds", "ran")

    def __init__(self, entry, start: float, seconds: float) -> None:
        self.entry = entry  # (batch, result) as the harness's launch returned it
        self.start = start  # virtual time its forward starts: when the one before it ends
        self.seconds = seconds
        self.ran = False  # its forward's time has passed on the clock

    @property
    def end(self) -> float:
        return self.start + self.seconds
