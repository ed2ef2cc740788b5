"""Per-request program metadata: which agent program a turn belongs to, and whether it is the last.

Clients put these keys in ``custom_params`` (OpenAI ``extra_body={"custom_params": {...}}``, native
``/generate`` ``sampling_params.custom_params``), or at the top level of an OpenAI body
(``merge_top_level``: the adapter adds them to ``custom_params``). The program id is read, in order of trust, from
``custom_params.program_id``, SGLang's ``session_id``, and SGLang's routing key (the
``X-SMG-Routing-Key`` header of the OpenAI endpoints, or ``routing_key`` in a native ``/generate``
body); a request with none of them may still be attributed to a program from its prefix
(``program_inference.py``). Malformed values are reported (rate-bounded, ``MalformedReporter``) and
ignored: a request whose program id cannot be read is served exactly as under FCFS.

Ids starting with ``RESERVED_PREFIX`` are the plugin's own (inferred programs, scoped ids): one a
client sends is malformed, so no client can name, join or end a program it did not make. Where
the operator scopes program ids (``program_scope_header``), the HTTP process writes the sender's
scope (``scope_of`` its credential or tenant header) into ``custom_params[SCOPE_KEY]``, overwriting
whatever the client sent there, and the effective id is ``scoped_program_id(scope, client id)``:
two tenants' ``run-1`` are two programs. ``/close_session`` carries the scope in its session id
(``close_session_id`` / ``read_close_session``), since SGLang's close request has no other field.
The scope travels on every request, with an id or without, and ranks the sender's programs for
fair shares between scopes (``scopes.py``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

logger = logging.getLogger(__name__)

PROGRAM_ID_KEY = "program_id"
LAST_STEP_KEY = "is_last_step"
TOOL_NAME_KEY = "tool_name"
STEP_KEY = "step"  # optional: the turn's 1-based position in its program
# Client hints (Tokencake's ``predict_time`` and application graph): how long the tool this turn's
# output calls should take, the multi-agent application the program belongs to, and whether the
# program is on that application's critical path.
TOOL_TIME_KEY = "tool_time_s"
APP_ID_KEY = "app_id"
CRITICAL_KEY = "critical"
# Accepted spellings from other Continuum clients (the vLLM reference uses job_id / is_last_step).
PROGRAM_ID_ALIASES = (PROGRAM_ID_KEY, "job_id")
LAST_STEP_ALIASES = (LAST_STEP_KEY, "last_step")

# Keys read as well at the top level of an OpenAI request body, where SGLang drops them: the
# Continuum authors' mini-swe-agent fork (a vLLM client) sends ``job_id`` and ``is_last_step`` there.
# Only the keys ``custom_params`` takes, so a client's unrelated top-level fields are never read.
TOP_LEVEL_GROUPS = (
    PROGRAM_ID_ALIASES,
    LAST_STEP_ALIASES,
    (TOOL_NAME_KEY,),
    (STEP_KEY,),
    (TOOL_TIME_KEY,),
    (APP_ID_KEY,),
    (CRITICAL_KEY,),
)

# Where a request's program id came from (``ProgramMeta.source``; counted per source in /metrics).
SOURCE_PROGRAM_ID = "program_id"
SOURCE_SESSION_ID = "session_id"
SOURCE_ROUTING_KEY = "routing_key"
SOURCE_INFERRED = "inferred"
SOURCE_FIRST_TURN = "first_turn"  # no id, continued nothing, taken as a new program (``first_turns.py``)
SOURCE_NONE = "none"
SOURCES = (SOURCE_PROGRAM_ID, SOURCE_SESSION_ID, SOURCE_ROUTING_KEY, SOURCE_INFERRED, SOURCE_FIRST_TURN, SOURCE_NONE)

# The plugin's own id namespace: inferred programs (``INFERRED_PREFIX``), scoped ids and
# ``/close_session`` envelopes. A client id in it is malformed (``_read_program_id``).
RESERVED_PREFIX = "continuum:"
INFERRED_PREFIX = RESERVED_PREFIX + "inferred-"  # ``adapter/inference.py``'s ProgramIndex ids
_SCOPED_PREFIX = RESERVED_PREFIX + "t-"  # + scope + ":" + the client's id
_CLOSE_PREFIX = RESERVED_PREFIX + "close-"  # + scope (or nothing) + ":" + the client's session id
# custom_params key the HTTP process writes (overwriting the client's): the sender's scope. Named
# like SGLang's own private custom_params keys (``__sglang_reasoning_end_token_ids``).
SCOPE_KEY = "__continuum_scope"
SCOPE_HEX_LEN = 24  # 96 bits of blake2b: a tenant cannot craft a credential that collides with another's
_SCOPE_PERSON = b"continuum-scope"
_HEX = frozenset("0123456789abcdef")

MAX_PROGRAM_ID_LEN = 256
MAX_TOOL_NAME_LEN = 128
MAX_STEP = 1 << 31
MAX_TOOL_TIME_S = 3600.0  # a longer hint says nothing a pin or an upload could use
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class ProgramMeta:
    program_id: Optional[str] = None
    is_last_step: bool = False
    tool_name: Optional[str] = None
    step: Optional[int] = None
    source: Optional[str] = None  # one of SOURCES; None: program_id if there is one (built by hand)
    announces_end: bool = False  # the client sent a last-step flag: it will say which turn is the last
    tool_time_s: Optional[float] = None  # the client's forecast of the tool call this turn's output makes
    app_id: Optional[str] = None  # the multi-agent application the program belongs to
    critical: bool = False  # the program is on its application's critical path
    scope: Optional[str] = None  # the sender's scope (``SCOPE_KEY``), with or without a program id

    @property
    def has_program(self) -> bool:
        return self.program_id is not None

    @property
    def identified_by(self) -> str:
        """Where the program id came from (``SOURCES``)."""
        if self.source is not None:
            return self.source
        return SOURCE_PROGRAM_ID if self.program_id is not None else SOURCE_NONE


NO_PROGRAM = ProgramMeta()


class _Malformed(ValueError):
    pass


def _first(params: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in params:
            return params[key]
    return None


def _show(value: Any, limit: int = 200) -> str:
    """A bounded ``repr`` that cannot raise (an int past CPython's 4,300-digit limit does)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<{value.bit_length()}-bit integer>"
    try:
        return repr(value[: limit + 1] if isinstance(value, str) else value)[:limit]
    except Exception:
        return f"<{type(value).__name__}>"


def _read_program_id(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Malformed(f"program id must be a string or integer, got {type(value).__name__}")
    if isinstance(value, int) and value.bit_length() > 4 * MAX_PROGRAM_ID_LEN:  # str() would be slow or raise
        raise _Malformed(f"program id longer than {MAX_PROGRAM_ID_LEN} characters")
    text = str(value).strip()
    if not text:
        raise _Malformed("program id is empty")
    if len(text) > MAX_PROGRAM_ID_LEN:
        raise _Malformed(f"program id longer than {MAX_PROGRAM_ID_LEN} characters")
    if not text.isprintable():  # newlines would forge log lines; ESC and NUL reach terminals
        raise _Malformed(f"program id contains control characters: {text[:40]!r}")
    if text.startswith(RESERVED_PREFIX):  # inferred and scoped ids are the plugin's to make
        raise _Malformed(f"program id {text[:40]!r} is in the reserved namespace {RESERVED_PREFIX!r}")
    return text


def scope_of(credential: str) -> str:
    """The scope of a credential or tenant name: a fixed-length hash, so the credential itself never
    leaves the HTTP process and ``scoped_program_id`` stays unambiguous."""
    digest = hashlib.blake2b(
        credential.encode("utf-8", "surrogatepass"), digest_size=SCOPE_HEX_LEN // 2, person=_SCOPE_PERSON
    )
    return digest.hexdigest()


def is_scope(value: Any) -> bool:
    return isinstance(value, str) and len(value) == SCOPE_HEX_LEN and _HEX.issuperset(value)


def scoped_program_id(scope: Optional[str], program_id: str) -> str:
    """The effective id of a client's ``program_id`` sent under ``scope`` (None: unscoped, as sent)."""
    return program_id if scope is None else f"{_SCOPED_PREFIX}{scope}:{program_id}"


def client_program_id(program_id: str) -> Optional[str]:
    """The client's id inside a scoped effective id (``scoped_program_id``'s inverse), never its
    scope; None for an id that is not scoped."""
    if not program_id.startswith(_SCOPED_PREFIX):
        return None
    return program_id[len(_SCOPED_PREFIX) :].partition(":")[2]


def _read_bool(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _Malformed(f"must be a boolean, got {_show(value)}")


def _read_step(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Malformed(f"step must be a positive integer, got {type(value).__name__}")
    try:
        step = int(value)
    except ValueError:
        raise _Malformed(f"step must be a positive integer, got {_show(value)}") from None
    if not 1 <= step <= MAX_STEP:
        raise _Malformed(f"step must be a positive integer up to {MAX_STEP}, got {_show(step)}")
    return step


def _read_tool_name(value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or not value.strip().isprintable():
        raise _Malformed(f"tool name must be a non-empty printable string, got {_show(value)}")
    return value.strip()[:MAX_TOOL_NAME_LEN]


def _read_tool_time(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Malformed(f"tool time must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        raise _Malformed(f"tool time must be a number of seconds, got {_show(value)}") from None
    if not 0.0 < seconds <= MAX_TOOL_TIME_S:  # NaN fails both comparisons
        raise _Malformed(f"tool time must be in (0, {MAX_TOOL_TIME_S:g}] seconds, got {_show(value)}")
    return seconds


def _read_app_id(value: Any) -> Optional[str]:
    if value is None:
        return None
    try:
        return _read_program_id(value)  # the same rules: a bounded printable name outside the reserved space
    except _Malformed as exc:
        raise _Malformed(str(exc).replace("program id", "must be a name:", 1)) from None


class MalformedReporter:
    """Logs a malformed-metadata warning once per (program, problem), and at most ``max_lines`` per
    ``window_s``: a client sending a new malformed value with every request cannot flood the log.
    Past the bound, reports are counted, and the first report of a later window logs how many were
    suppressed. ``count`` counts every report, logged or not; memory is bounded (``max_entries``)."""

    def __init__(
        self,
        max_entries: int = 4096,
        log: Callable[..., None] = logger.warning,
        *,
        max_lines: int = 10,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seen: dict[tuple[Optional[str], str], None] = {}
        self._max = max_entries
        self._log = log
        self._max_lines = max_lines
        self._window_s = window_s
        self._clock = clock
        self._window_start: Optional[float] = None
        self._lines = 0  # logged in the current window
        self._held = 0  # suppressed in the current window, not yet told
        self.count = 0
        self.suppressed = 0  # new problems never logged, for the rate bound

    def __call__(self, program_id: Optional[str], problem: str) -> None:
        self.count += 1
        key = (program_id, problem)
        if key in self._seen:
            return
        if len(self._seen) >= self._max:
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = None
        now = self._clock()
        if self._window_start is None or now - self._window_start >= self._window_s:
            if self._held:
                self._log(
                    "continuum: %d more malformed request metadata reports were not logged "
                    "(at most %d lines per %.0f s)",
                    self._held,
                    self._max_lines,
                    self._window_s,
                )
            self._window_start, self._lines, self._held = now, 0, 0
        if self._lines >= self._max_lines:
            self._held += 1
            self.suppressed += 1
            return
        self._lines += 1
        self._log("continuum: ignoring malformed request metadata (program=%s): %s", program_id, problem)


_default_report = MalformedReporter()


def _read_id(
    params: Mapping[str, Any],
    session_id: Any,
    routing_key: Any,
    report: Callable[[Optional[str], str], None],
    scope: Any,
) -> tuple[Optional[str], str]:
    """The effective program id (scoped by ``scope``, ``params[SCOPE_KEY]`` as sent) and its source;
    (None, ...) when there is none."""
    program_id: Optional[str] = None
    source = SOURCE_PROGRAM_ID
    try:
        program_id = _read_program_id(_first(params, PROGRAM_ID_ALIASES))
    except _Malformed as exc:
        report(None, str(exc))
    for fallback, name in ((session_id, SOURCE_SESSION_ID), (routing_key, SOURCE_ROUTING_KEY)):
        if program_id is not None or fallback is None:
            continue
        try:
            program_id, source = _read_program_id(fallback), name
        except _Malformed as exc:
            report(None, f"{name}: {exc}")
    if program_id is None or scope is None:
        return program_id, source
    if not is_scope(scope):  # only the HTTP process writes it: never fall back to unscoped
        report(None, f"{SCOPE_KEY} is not a scope: {_show(scope, 40)}")
        return None, source
    return scoped_program_id(scope, program_id), source


def parse_program_meta(
    custom_params: Any,
    session_id: Any = None,
    report: Optional[Callable[[Optional[str], str], None]] = None,
    routing_key: Any = None,
) -> ProgramMeta:
    """Read program metadata; never raises. Bad fields are reported and treated as absent.
    The program id is ``custom_params``'s, else ``session_id``, else ``routing_key``; none of them
    may be in the reserved namespace. Under a scope (``SCOPE_KEY``, written by the HTTP process)
    the id is ``scoped_program_id(scope, id)``."""
    report = report or _default_report
    params: Mapping[str, Any] = custom_params if isinstance(custom_params, Mapping) else {}
    if custom_params is not None and not isinstance(custom_params, Mapping):
        report(None, f"custom_params must be an object, got {type(custom_params).__name__}")
    raw_scope = params.get(SCOPE_KEY)
    program_id, source = _read_id(params, session_id, routing_key, report, raw_scope)
    scope = raw_scope if is_scope(raw_scope) else None  # a bad one is reported by ``_read_id`` with an id
    if program_id is None:
        return NO_PROGRAM if scope is None else ProgramMeta(scope=scope)

    is_last = False
    last_step = _first(params, LAST_STEP_ALIASES)
    announced = last_step is not None
    try:
        is_last = _read_bool(last_step)
    except _Malformed as exc:
        report(program_id, f"last-step flag {exc}")
        announced = False
    tool_name = None
    try:
        tool_name = _read_tool_name(params.get(TOOL_NAME_KEY))
    except _Malformed as exc:
        report(program_id, str(exc))
    step = None
    try:
        step = _read_step(params.get(STEP_KEY))
    except _Malformed as exc:
        report(program_id, str(exc))
    hints = _read_hints(params, program_id, report)
    if "app_id" in hints and scope is not None:  # one tenant's application is not another's
        hints["app_id"] = scoped_program_id(scope, hints["app_id"])
    return ProgramMeta(
        program_id=program_id,
        is_last_step=is_last,
        tool_name=tool_name,
        step=step,
        source=source,
        announces_end=announced,
        scope=scope,
        **hints,
    )


def _read_hints(params: Mapping[str, Any], program_id: str, report: Callable[[Optional[str], str], None]) -> dict:
    """The client's hints, each read on its own: a malformed one is reported and left out."""
    hints: dict[str, Any] = {}
    for key, field, read in (
        (TOOL_TIME_KEY, "tool_time_s", _read_tool_time),
        (APP_ID_KEY, "app_id", _read_app_id),
        (CRITICAL_KEY, "critical", _read_bool),
    ):
        try:
            value = read(params.get(key))
        except _Malformed as exc:
            report(program_id, f"{key}: {exc}")
            continue
        if value is not None:
            hints[field] = value
    return hints


def close_session_id(session_id: Any, scope: Optional[str]) -> Any:
    """The session id the HTTP process forwards for ``/close_session``: the client's own when it
    is unscoped and outside the reserved namespace (exactly what SGLang forwards), else an envelope
    that carries the sender's scope, read back by ``read_close_session`` in the scheduler. A client
    id that looks like an envelope is itself reserved, so it is wrapped too: never read as one."""
    if not isinstance(session_id, str) or (scope is None and not session_id.strip().startswith(RESERVED_PREFIX)):
        return session_id
    return f"{_CLOSE_PREFIX}{scope or ''}:{session_id}"


def read_close_session(session_id: Any) -> tuple[Any, Optional[str]]:
    """``/close_session``'s id as the scheduler receives it -> (SGLang's session id, the program
    it ends: None if it names none a client may end). Never raises."""
    report = MalformedReporter(max_entries=1, log=logger.debug)  # SGLang's own sessions need not be programs
    scope: Optional[str] = None
    if isinstance(session_id, str) and session_id.startswith(_CLOSE_PREFIX):
        head, sep, raw = session_id[len(_CLOSE_PREFIX) :].partition(":")
        if not sep or not (head == "" or is_scope(head)):
            return session_id, None
        session_id, scope = raw, head or None
    params = {SCOPE_KEY: scope} if scope is not None else None
    return session_id, parse_program_meta(params, session_id=session_id, report=report).program_id


def merge_top_level(
    body: Any, custom_params: Any, report: Optional[Callable[[Optional[str], str], None]] = None
) -> Optional[dict]:
    """``custom_params`` with the metadata keys a client sent at the top level of its request body
    (``TOP_LEVEL_GROUPS``) added, or None when there is nothing to add. ``custom_params`` wins: a
    group with any key of it there is not read from the top level. Only JSON scalars are taken
    (SGLang refuses a request whose ``custom_params`` nests); others are reported and ignored.
    Values are checked where they are read (``parse_program_meta``), as any ``custom_params``."""
    if not isinstance(body, Mapping) or not (custom_params is None or isinstance(custom_params, Mapping)):
        return None  # a malformed custom_params is SGLang's to refuse and parse_program_meta's to report
    explicit = custom_params or {}
    added: dict[str, Any] = {}
    for group in TOP_LEVEL_GROUPS:
        if any(key in explicit for key in group):
            continue
        for key in group:
            value = body.get(key)
            if value is None:
                continue
            if isinstance(value, (str, int, float, bool)):
                added[key] = value
            elif report is not None:
                report(None, f"top-level {key} must be a JSON scalar, got {type(value).__name__}")
    if not added:
        return None
    return {**explicit, **added}
