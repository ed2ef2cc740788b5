"""Per-request program metadata: which agent program a turn belongs to, and whether it is the last.

Clients put these keys in ``custom_params`` (OpenAI ``extra_body={"custom_params": {...}}``, native
``/generate`` ``sampling_params.custom_params``), or at the top level of an OpenAI body
(``merge_top_level``: the adapter adds them to ``custom_params``). The program id is read, in order of trust, from
``custom_params.program_id``, SGLang's ``session_id``, and SGLang's routing key (the
``X-SMG-Routing-Key`` header of the OpenAI endpoints, or ``routing_key`` in a native ``/generate``
body); a request with none of them may still be attributed to a program from its prefix
(``program_inference.py``). Malformed values are reported once per program and ignored: a request
whose program id cannot be read is served exactly as under FCFS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

logger = logging.getLogger(__name__)

PROGRAM_ID_KEY = "program_id"
LAST_STEP_KEY = "is_last_step"
TOOL_NAME_KEY = "tool_name"
STEP_KEY = "step"  # optional: the turn's 1-based position in its program
# Accepted spellings from other Continuum clients (the vLLM reference uses job_id / is_last_step).
PROGRAM_ID_ALIASES = (PROGRAM_ID_KEY, "job_id")
LAST_STEP_ALIASES = (LAST_STEP_KEY, "last_step")

# Keys read as well at the top level of an OpenAI request body, where SGLang drops them: the
# Continuum authors' mini-swe-agent fork (a vLLM client) sends ``job_id`` and ``is_last_step`` there.
# Only the keys ``custom_params`` takes, so a client's unrelated top-level fields are never read.
TOP_LEVEL_GROUPS = (PROGRAM_ID_ALIASES, LAST_STEP_ALIASES, (TOOL_NAME_KEY,), (STEP_KEY,))

# Where a request's program id came from (``ProgramMeta.source``; counted per source in /metrics).
SOURCE_PROGRAM_ID = "program_id"
SOURCE_SESSION_ID = "session_id"
SOURCE_ROUTING_KEY = "routing_key"
SOURCE_INFERRED = "inferred"
SOURCE_FIRST_TURN = "first_turn"  # no id, continued nothing, taken as a new program (``first_turns.py``)
SOURCE_NONE = "none"
SOURCES = (SOURCE_PROGRAM_ID, SOURCE_SESSION_ID, SOURCE_ROUTING_KEY, SOURCE_INFERRED, SOURCE_FIRST_TURN, SOURCE_NONE)

MAX_PROGRAM_ID_LEN = 256
MAX_TOOL_NAME_LEN = 128
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


def _read_program_id(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Malformed(f"program id must be a string or integer, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise _Malformed("program id is empty")
    if len(text) > MAX_PROGRAM_ID_LEN:
        raise _Malformed(f"program id longer than {MAX_PROGRAM_ID_LEN} characters")
    if not text.isprintable():  # newlines would forge log lines; ESC and NUL reach terminals
        raise _Malformed(f"program id contains control characters: {text[:40]!r}")
    return text


def _read_bool(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _Malformed(f"last-step flag must be a boolean, got {value!r}"[:200])


def _read_step(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Malformed(f"step must be a positive integer, got {type(value).__name__}")
    try:
        step = int(value)
    except ValueError:
        raise _Malformed(f"step must be a positive integer, got {value!r}"[:200]) from None
    if step < 1:
        raise _Malformed(f"step must be a positive integer, got {step}")
    return step


def _read_tool_name(value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or not value.strip().isprintable():
        raise _Malformed(f"tool name must be a non-empty printable string, got {value!r}"[:200])
    return value.strip()[:MAX_TOOL_NAME_LEN]


class MalformedReporter:
    """Logs a malformed-metadata warning once per (program, problem); bounded memory."""

    def __init__(self, max_entries: int = 4096, log: Callable[..., None] = logger.warning) -> None:
        self._seen: dict[tuple[Optional[str], str], None] = {}
        self._max = max_entries
        self._log = log
        self.count = 0

    def __call__(self, program_id: Optional[str], problem: str) -> None:
        self.count += 1
        key = (program_id, problem)
        if key in self._seen:
            return
        if len(self._seen) >= self._max:
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = None
        self._log("continuum: ignoring malformed request metadata (program=%s): %s", program_id, problem)


def parse_program_meta(
    custom_params: Any,
    session_id: Any = None,
    report: Optional[Callable[[Optional[str], str], None]] = None,
    routing_key: Any = None,
) -> ProgramMeta:
    """Read program metadata; never raises. Bad fields are reported and treated as absent.
    The program id is ``custom_params``'s, else ``session_id``, else ``routing_key``."""
    report = report or (lambda pid, problem: logger.warning("continuum: %s (program=%s)", problem, pid))
    params: Mapping[str, Any] = custom_params if isinstance(custom_params, Mapping) else {}
    if custom_params is not None and not isinstance(custom_params, Mapping):
        report(None, f"custom_params must be an object, got {type(custom_params).__name__}")

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
    if program_id is None:
        return NO_PROGRAM

    is_last = False
    last_step = _first(params, LAST_STEP_ALIASES)
    announced = last_step is not None
    try:
        is_last = _read_bool(last_step)
    except _Malformed as exc:
        report(program_id, str(exc))
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
    return ProgramMeta(
        program_id=program_id,
        is_last_step=is_last,
        tool_name=tool_name,
        step=step,
        source=source,
        announces_end=announced,
    )


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
