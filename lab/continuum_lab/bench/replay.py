"""Async replay client: agent programs against any SGLang or OpenAI-compatible server.

Programs arrive as a seeded Poisson process (``jps`` programs per second). Each program sends its
turns in order, each with the whole accumulated context (previous prompt + previous output + the
turn's appended tokens), and waits the turn's tool duration before the next one. Output lengths
are forced (``max_new_tokens``/``max_tokens`` with ``ignore_eos``) so every policy does the same
work. Program metadata (program id, last step, tool name) travels in ``custom_params`` and
``session_id``; program-affine routers get the ``x-smg-routing-key`` header.

Appended tokens are random ids drawn from a per-program generator seeded by (seed, program id),
so every policy sees identical prompts; a grouped program's first prompt (``Program.group``: an
RL rollout's samples of one prompt) from its group's generator, the same ids for the whole group. With ``identity="routing-key"`` (``continuum-bench --identity
routing-key``) only SGLang's routing key travels (the header and ``/generate``'s ``routing_key``);
with ``identity="none"`` (``--identity none``, ``--no-ids``) no program metadata travels at all.
Without ids native requests are named ``<program>#<turn>`` (SGLang's ``rid``) so the server's
attributions can be scored (``bench/attribution.py``). With ``api="sglang"`` (native ``/generate``) the model's
real output ids continue the context, as in a real agent; with ``api="openai"``
(``/v1/completions`` with token-id prompts) the output ids are not returned, so fixed
placeholder ids of the same length continue it instead.

A client gives up on a try that has no first token ``client_timeout_s`` after it was sent (0: it
waits forever) and resends the turn, up to ``client_retries`` times, as the OpenAI Python SDK does
against SGLang's ``/v1`` endpoints (600 s, 2 retries: ``OPENAI_CLIENT_TIMEOUT_S``,
``OPENAI_CLIENT_RETRIES``; those endpoints answer once the first chunk is out). The try is
cancelled, which closes its connection, and SGLang aborts a request whose client went away; a
resend is a new request (with ``--identity none`` named by ``attribution.retry_rid``). A turn that times
out on every try fails its program. A timed-out try gives its client nothing: a turn's record
holds its last try's figures, but its TTFT and queue time count from its first try's send (what
the user waited).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

import httpx
import orjson

from continuum_lab.bench.attribution import retry_rid, turn_rid
from continuum_lab.workloads.schema import Program
from sglang_continuum.client import continuum_custom_params, routing_headers


@dataclass
class TurnRecord:
    program_id: str
    turn: int
    send: float
    first_token: Optional[float] = None
    finish: Optional[float] = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cached_host_tokens: int = 0  # of cached_tokens, loaded back from HiCache's host tier
    output_tokens: int = 0
    queue_time_s: Optional[float] = None
    error: Optional[str] = None
    timeouts: int = 0  # tries with no first token within the client timeout
    retries: int = 0  # tries resent after one timed out

    @property
    def ttft(self) -> Optional[float]:
        """From the first try's send: a retried turn's user waited through its timed-out tries."""
        return None if self.first_token is None else self.first_token - self.send

    @property
    def timed_out(self) -> bool:
        """Its last try timed out too: the client gave up on the turn (``error`` says so)."""
        return self.timeouts > self.retries

    def forget_try(self) -> None:
        """A try timed out: what it measured is not the turn's (it gave its client nothing)."""
        self.first_token = self.queue_time_s = None
        self.output_tokens = self.cached_tokens = self.cached_host_tokens = 0


OPENAI_CLIENT_TIMEOUT_S = 600.0  # the OpenAI Python SDK's request timeout ...
OPENAI_CLIENT_RETRIES = 2  # ... and its retries: what an agent on it gets unless it says otherwise
TIMEOUT_ERROR = "client timeout"


def timeout_error(timeout_s: float, tries: int) -> str:
    return f"{TIMEOUT_ERROR}: no first token within {timeout_s:g} s, {tries} tries"


def client_patience(timeout_s: float, retries: int) -> str:
    """What a report says its clients did."""
    if not timeout_s:
        return "clients wait for every turn, however long"
    return f"a client gives up on a try after {timeout_s:g} s without a first token and resends the turn up to {retries} times"


@dataclass
class ProgramRecord:
    program_id: str
    planned_arrival: float
    start: Optional[float] = None
    end: Optional[float] = None
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.end is not None and all(t.error is None for t in self.turns)

    @property
    def jct(self) -> Optional[float]:
        return None if not self.ok else self.end - self.start

    @property
    def timed_out(self) -> bool:
        """It failed because a turn timed out on every try."""
        return any(t.timed_out for t in self.turns)


@dataclass
class ReplayResult:
    programs: list[ProgramRecord]
    wall_s: float
    metrics_before: str = ""  # every scraped server's /metrics, concatenated (series sum over them)
    metrics_after: str = ""
    worker_metrics: list[tuple[str, str, str]] = field(default_factory=list)  # (url, before, after) each
    metrics_at: dict[str, str] = field(default_factory=dict)  # seconds into the run -> /metrics then
    client_timeout_s: float = 0.0  # what its clients ran under (0: they waited forever, as before timeouts)
    client_retries: int = 0

    def to_dict(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "metrics_at": self.metrics_at,
            "client_timeout_s": self.client_timeout_s,
            "client_retries": self.client_retries,
            "programs": [
                {
                    **{k: v for k, v in asdict(p).items() if k != "turns"},
                    "jct": p.jct,
                    "ok": p.ok,
                    "timed_out": p.timed_out,
                    "turns": [{**asdict(t), "ttft": t.ttft} for t in p.turns],
                }
                for p in self.programs
            ],
        }

    @classmethod
    def from_dict(cls, data: dict, metrics_before: str = "", metrics_after: str = "") -> "ReplayResult":
        turn_fields = set(TurnRecord.__dataclass_fields__)
        program_fields = set(ProgramRecord.__dataclass_fields__) - {"turns"}
        programs = [
            ProgramRecord(
                **{k: v for k, v in p.items() if k in program_fields},
                turns=[TurnRecord(**{k: v for k, v in t.items() if k in turn_fields}) for t in p["turns"]],
            )
            for p in data["programs"]
        ]
        return cls(
            programs,
            data["wall_s"],
            metrics_before,
            metrics_after,
            metrics_at=data.get("metrics_at", {}),
            client_timeout_s=data.get("client_timeout_s", 0.0),
            client_retries=data.get("client_retries", 0),
        )


def arrival_times(n: int, jps: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(jps) if jps > 0 else 0.0
    return out


def program_seed(seed: int, program_id: str) -> int:
    """A program's own token seed: stable across runs and policies, different per program."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{program_id}".encode(), digest_size=8).digest(), "little")


def _program_rng(seed: int, program_id: str) -> random.Random:
    return random.Random(program_seed(seed, program_id))


def shared_prompt_key(program: Program, turn: int) -> Optional[str]:
    """The key whose generator draws ``turn``'s appended ids when it is not the program's own:
    a group's first prompt is the group's (``program_seed(seed, key)``), the same for every sample."""
    return f"group:{program.group}" if turn == 0 and program.group is not None else None


def hinted(hints: Optional[dict[str, dict]], program: Program, turn: int, *, tool_times: bool = False) -> dict:
    """The client hints a turn carries (``continuum_custom_params``' ``app_id``, ``critical`` and
    ``tool_time_s``): none unless ``hints`` names the program (``bench/applications.py``) or
    ``tool_times`` (sessions with ``--hints``: every program's turns their tool time, the recorded
    gap as an exact forecast); the tool time only on a turn that calls a tool (the server reads none
    of 0 s)."""
    extra = (hints or {}).get(program.program_id)
    if extra is None and not tool_times:
        return {}
    extra = extra or {}
    seconds = program.turns[turn].tool_duration_s
    return {**extra, **({"tool_time_s": seconds} if seconds > 0 else {})}


# what a client tells the server about a turn's program: everything (program id, last step, tool, in
# ``custom_params`` and ``session_id``), only SGLang's routing key (what smg and the OpenAI endpoints
# carry: an agent that changes nothing behind a router), or nothing (the program is inferred)
IDENTITIES = ("ids", "routing-key", "none")

# the running try's first-token deadline (``Replayer._try``), lifted by ``_send`` at the first token
_FIRST_TOKEN_DEADLINE: contextvars.ContextVar[Optional[asyncio.Timeout]] = contextvars.ContextVar(
    "first_token_deadline", default=None
)


class Replayer:
    def __init__(
        self,
        url: str,
        *,
        api: str = "sglang",
        model: str = "default",
        vocab: int = 500,
        seed: int = 0,
        timeout_s: float = 900.0,
        identity: str = "ids",
        close_sessions: bool = False,
        on_turn: Optional[Callable[[TurnRecord], None]] = None,
        metrics_urls: Optional[list[str]] = None,
        scrape_at: tuple[float, ...] = (60.0,),
        temperature: float = 0.0,
        client_timeout_s: float = 0.0,
        client_retries: int = 0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        if api not in ("sglang", "openai"):
            raise ValueError("api must be 'sglang' or 'openai'")
        self.url = url.rstrip("/")
        self.api = api
        self.model = model
        self.vocab = vocab
        self.seed = seed
        self.timeout_s = timeout_s
        if identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {IDENTITIES}")
        self.identity = identity
        self.send_program_id = identity == "ids"
        self.close_sessions = close_sessions  # --enable-session-radix-cache: release the session at program end
        self.on_turn = on_turn
        self.metrics_urls = metrics_urls  # the workers behind a router (default: ``url`` itself)
        self.scrape_at = tuple(sorted(scrape_at))  # also scrape /metrics this many seconds in
        self.temperature = temperature  # > 0: samples of one prompt diverge (a rollout), lengths still forced
        if client_timeout_s < 0 or client_retries < 0:
            raise ValueError("the client timeout and retries must not be negative")
        self.client_timeout_s = client_timeout_s  # for a try's first token; 0: wait forever
        self.client_retries = client_retries
        self.transport = transport  # an in-process server instead of the network
        self.hints: Optional[dict[str, dict]] = None  # program id -> its application hints (``hinted``)
        self.tool_times = False  # every turn hints its tool time (``hinted``)
        self.t0 = 0.0

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _body(self, program: Program, i: int, ids: list[int]) -> tuple[str, dict, dict]:
        turn = program.turns[i]
        last = i == len(program.turns) - 1
        custom = continuum_custom_params(
            program.program_id,
            last_step=last,
            tool_name=turn.tool,
            step=i + 1,
            **hinted(self.hints, program, i, tool_times=self.tool_times),
        )
        headers = routing_headers(program.program_id) if self.identity != "none" else {}
        if self.api == "sglang":
            body = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": turn.output_tokens,
                    "ignore_eos": True,
                    "temperature": self.temperature,
                },
                "stream": True,
            }
            if self.send_program_id:
                body["sampling_params"]["custom_params"] = custom
                body["session_id"] = program.program_id
            else:
                body["rid"] = turn_rid(program.program_id, i)  # the truth, for scoring attribution
                if self.identity == "routing-key":
                    body["routing_key"] = program.program_id
            return "/generate", body, headers
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": turn.output_tokens,
            "ignore_eos": True,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.send_program_id:
            body["custom_params"] = custom
            body["session_id"] = program.program_id
        return "/v1/completions", body, headers

    async def _send(
        self, client: httpx.AsyncClient, rec: TurnRecord, path: str, body: dict, headers: dict
    ) -> list[int]:
        output_ids: list[int] = []
        async with client.stream("POST", self.url + path, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return output_ids
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                if rec.first_token is None:
                    rec.first_token = self._now()
                    if (deadline := _FIRST_TOKEN_DEADLINE.get()) is not None:
                        deadline.reschedule(None)  # the stream may now take as long as it takes
                chunk = orjson.loads(payload)
                if self.api == "sglang":
                    meta = chunk.get("meta_info", {})
                    rec.prompt_tokens = meta.get("prompt_tokens", rec.prompt_tokens)
                    rec.cached_tokens = meta.get("cached_tokens", rec.cached_tokens)
                    rec.cached_host_tokens = (meta.get("cached_tokens_details") or {}).get(
                        "host", rec.cached_host_tokens
                    )
                    rec.output_tokens = meta.get("completion_tokens", rec.output_tokens)
                    if meta.get("queue_time") is not None:
                        rec.queue_time_s = float(meta["queue_time"])
                    if chunk.get("output_ids"):
                        output_ids = list(chunk["output_ids"])
                else:
                    usage = chunk.get("usage") or {}
                    if usage:
                        rec.prompt_tokens = usage.get("prompt_tokens", 0)
                        rec.output_tokens = usage.get("completion_tokens", 0)
                        details = usage.get("prompt_tokens_details") or {}
                        rec.cached_tokens = details.get("cached_tokens") or 0
        return output_ids

    async def _turn(
        self, client: httpx.AsyncClient, rec: TurnRecord, path: str, body: dict, headers: dict
    ) -> list[int]:
        """The turn's output ids; ``rec.error`` says why when it failed. A try with no first token
        within the client timeout is cancelled and the turn sent again, up to the retries."""
        for retry in range(self.client_retries + 1):
            sent = rec.send if retry == 0 else self._now()
            if retry:
                rec.retries += 1
                if "rid" in body:  # a resend is a new request: SGLang refuses a rid it still holds
                    body = {**body, "rid": retry_rid(rec.program_id, rec.turn, retry)}
            try:
                out = await self._try(client, rec, path, body, headers)
            except TimeoutError:
                rec.timeouts += 1
                rec.forget_try()
                continue
            except (httpx.HTTPError, ValueError) as exc:
                rec.error = f"{type(exc).__name__}: {exc}"[:300]
                return []
            if rec.queue_time_s is not None:  # the server's counts from this try's arrival
                rec.queue_time_s += sent - rec.send
            return out
        rec.error = timeout_error(self.client_timeout_s, self.client_retries + 1)
        return []

    async def _try(self, client: httpx.AsyncClient, rec: TurnRecord, path: str, body: dict, headers: dict) -> list[int]:
        """One try; ``TimeoutError`` when no first token came within the client timeout. Leaving the
        stream then closes its connection, and SGLang aborts a request whose client went away."""
        if not self.client_timeout_s:
            return await self._send(client, rec, path, body, headers)
        async with asyncio.timeout(self.client_timeout_s) as deadline:
            token = _FIRST_TOKEN_DEADLINE.set(deadline)
            try:
                return await self._send(client, rec, path, body, headers)
            finally:
                _FIRST_TOKEN_DEADLINE.reset(token)

    async def _program(self, client: httpx.AsyncClient, program: Program, rec: ProgramRecord) -> None:
        await asyncio.sleep(max(0.0, rec.planned_arrival - self._now()))
        rng = _program_rng(self.seed, program.program_id)
        context: list[int] = []
        for i, turn in enumerate(program.turns):
            key = shared_prompt_key(program, i)
            draw = rng if key is None else _program_rng(self.seed, key)
            context += [draw.randrange(5, self.vocab) for _ in range(turn.append_tokens)]
            t = TurnRecord(program.program_id, i, send=self._now())
            if i == 0:
                rec.start = t.send  # JCT: first request sent to last response
            rec.turns.append(t)
            out = await self._turn(client, t, *self._body(program, i, context))
            t.finish = self._now()
            if self.on_turn is not None:
                self.on_turn(t)
            if t.error is not None:
                return
            if len(out) != turn.output_tokens:  # openai api, or a server that does not return ids
                out = [(7 * j + 11) % (self.vocab - 5) + 5 for j in range(turn.output_tokens)]
            context += out
            if turn.tool_duration_s > 0:
                await asyncio.sleep(turn.tool_duration_s)
        rec.end = rec.turns[-1].finish
        if self.close_sessions:
            try:
                await client.post(self.url + "/close_session", json={"session_id": program.program_id})
            except httpx.HTTPError:
                pass  # the session ends with its radix references anyway when the server stops

    async def run(self, programs: list[Program], jps: float, until: Optional[float] = None) -> ReplayResult:
        """Programs arrive at ``jps`` (0: all at once); returns when every one has finished, or at
        ``until`` seconds in: then every turn still in flight is cancelled and left unfinished."""
        arrivals = arrival_times(len(programs), jps, self.seed)
        records = [ProgramRecord(p.program_id, a) for p, a in zip(programs, arrivals)]

        async def drive(client: httpx.AsyncClient) -> None:
            if until is None:
                await asyncio.gather(*(self._program(client, p, r) for p, r in zip(programs, records)))
                return
            tasks = [asyncio.create_task(self._program(client, p, r)) for p, r in zip(programs, records)]
            done, pending = await asyncio.wait(tasks, timeout=until)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                task.result()  # a client error is raised, as without a limit

        return await self._measured(len(programs), drive, records)

    async def run_sessions(
        self, sessions: Iterator[Program], concurrency: int, start_times: list[float], until: float
    ) -> ReplayResult:
        """``concurrency`` sessions in flight (``bench/sessions.py``), each replaced by the next of
        ``sessions`` when it ends, until ``until`` seconds in: then every turn still in flight is
        cancelled (the server aborts a request whose client went away) and left unfinished."""
        records: list[ProgramRecord] = []

        async def slot(client: httpx.AsyncClient, start: float) -> None:
            await asyncio.sleep(max(0.0, start - self._now()))
            while True:
                program = next(sessions)
                records.append(rec := ProgramRecord(program.program_id, self._now()))
                await self._program(client, program, rec)

        async def drive(client: httpx.AsyncClient) -> None:
            slots = [asyncio.create_task(slot(client, at)) for at in start_times[:concurrency]]
            await asyncio.sleep(until)
            for task in slots:
                task.cancel()
            await asyncio.gather(*slots, return_exceptions=True)

        return await self._measured(concurrency, drive, records)

    async def _measured(self, connections: int, drive: Callable, records: list[ProgramRecord]) -> ReplayResult:
        """``drive(client)`` against the server, with ``/metrics`` scraped before, at the marks
        and once the plugin's counters have settled after it."""
        limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
        timeout = max(self.timeout_s, self.client_timeout_s)  # httpx's own read timeout must not come first
        async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=self.transport) as client:
            urls = self.metrics_urls or [self.url]
            before = [await _metrics(client, u) for u in urls]
            self.t0 = time.perf_counter()
            marks: dict[str, str] = {}
            scraper = asyncio.create_task(self._scrape_marks(client, urls, marks))
            await drive(client)
            wall = self._now()
            scraper.cancel()  # marks past the end of the run are not scraped
            after = await _rested_metrics(client, urls)
        per_worker = list(zip(urls, before, after)) if self.metrics_urls else []
        return ReplayResult(records, wall, "\n".join(before), "\n".join(after), per_worker, marks,
                            self.client_timeout_s, self.client_retries)  # fmt: skip

    async def _scrape_marks(self, client: httpx.AsyncClient, urls: list[str], marks: dict[str, str]) -> None:
        for at in self.scrape_at:
            await asyncio.sleep(max(0.0, at - self._now()))
            marks[f"{at:g}"] = "\n".join([await _metrics(client, u) for u in urls])


async def _metrics(client: httpx.AsyncClient, url: str) -> str:
    try:
        r = await client.get(url + "/metrics", timeout=10)
        return r.text if r.status_code == 200 else ""
    except httpx.HTTPError:
        return ""


# The plugin refreshes its series at most every 0.5 s while serving and at every idle iteration,
# so a scrape right after the last response can precede the last program's counters; counters
# that agree over a longer gap than that are current.
REST_S = 0.6
REST_DEADLINE_S = 15.0


def _counters(texts: list[str]) -> list[list[str]]:
    return [[ln for ln in t.splitlines() if ln.startswith("sglang:continuum_") and "_total" in ln] for t in texts]


async def _rested_metrics(client: httpx.AsyncClient, urls: list[str]) -> list[str]:
    """Every server's /metrics once the plugin's counters have stopped moving (or the deadline)."""
    texts = [await _metrics(client, u) for u in urls]
    deadline = time.monotonic() + REST_DEADLINE_S
    while time.monotonic() < deadline:
        await asyncio.sleep(REST_S)
        again = [await _metrics(client, u) for u in urls]
        settled = _counters(again) == _counters(texts)
        texts = again
        if settled:
            break
    return texts


def replay(url: str, programs: list[Program], *, jps: float, **kw) -> ReplayResult:
    return asyncio.run(Replayer(url, **kw).run(programs, jps))
