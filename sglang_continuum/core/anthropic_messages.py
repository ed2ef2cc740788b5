"""Program metadata of an Anthropic Messages request (``/v1/messages``), the API Claude Code speaks.

SGLang serves ``/v1/messages`` by converting the request to a chat completion, so the OpenAI
path's top-level fields never reach it; the adapter calls ``program_params`` with what the
request carries and writes the result into the chat request's ``custom_params``:

* keys ``custom_params`` takes (``program_id``, ``is_last_step``, ``tool_name``, ...) in the
  request's ``metadata``, for any Anthropic client that says which program a turn belongs to;
* otherwise Claude Code's session: the ``X-Claude-Code-Session-Id`` header its newer versions send
  on every request, else the session in ``metadata.user_id`` (``user_<h>_account_<a>_session_<id>``,
  or a JSON object with ``session_id``). One session runs several conversations, the main agent
  and its subagents, each with its own system prompt and first task: each is a program of its own
  (``<session>/<digest of both>``). Both parts must stay the same for the prefix cache to hit at
  all, so the digest changes only where the cache would miss anyway. A request that offers no
  tools cannot be a turn that ends in a tool call: Claude Code's side requests (titles, topic and
  quota checks) are served as requests without an id, never as turns of the conversation.

``strip_attribution`` drops the ``x-anthropic-billing-header`` block Claude Code puts first in
the system prompt. Its ``cch=`` value changes on every request, so left in place it makes every
turn's prompt differ from the last after a few dozen tokens, for every schedule policy.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping, Optional

import orjson

from sglang_continuum.core.metadata import LAST_STEP_ALIASES, PROGRAM_ID_ALIASES, merge_top_level

SESSION_HEADER = "x-claude-code-session-id"
PROGRAM_PREFIX = "claude-code:"
ATTRIBUTION_PREFIX = "x-anthropic-billing-header:"
MAX_SESSION_LEN = 128
DIGEST_INPUT_CHARS = 16384  # enough to tell conversations apart; bounded cost per request
_LEGACY_SESSION = re.compile(r"_session_([0-9A-Za-z-]{1,128})$")
_SESSION_CHARS = re.compile(r"^[0-9A-Za-z._-]+$")


def _field(item: Any, name: str, default: Any = None) -> Any:
    """A field of a block or message, whether SGLang parsed it (a model) or not (a dict)."""
    if isinstance(item, Mapping):
        return item.get(name, default)
    return getattr(item, name, default)


def _is_attribution(block: Any) -> bool:
    text = _field(block, "text")
    return _field(block, "type") == "text" and isinstance(text, str) and text.lstrip().startswith(ATTRIBUTION_PREFIX)


def strip_attribution(system: Any) -> Any:
    """``system`` without Claude Code's attribution block (or, in a string, its line); the same
    object when there is none."""
    if isinstance(system, str):
        head, sep, rest = system.lstrip().partition("\n")
        return rest if head.startswith(ATTRIBUTION_PREFIX) else system
    if isinstance(system, list) and any(_is_attribution(block) for block in system):
        return [block for block in system if not _is_attribution(block)]
    return system


def _clean_session(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_SESSION_LEN or not _SESSION_CHARS.match(value):
        return None
    return value


def _session_in_user_id(user_id: Any) -> Optional[str]:
    if not isinstance(user_id, str) or len(user_id) > 4096:
        return None
    if user_id.lstrip().startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        return _clean_session(parsed.get("session_id")) if isinstance(parsed, dict) else None
    match = _LEGACY_SESSION.search(user_id)
    return _clean_session(match.group(1)) if match else None


def session_of(session_header: Any, metadata: Any) -> Optional[str]:
    """Claude Code's session id: the header's, else the one in ``metadata.user_id``."""
    session = _clean_session(session_header)
    if session is None and isinstance(metadata, Mapping):
        session = _session_in_user_id(metadata.get("user_id"))
    return session


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_field(block, "text") for block in content) if isinstance(t, str))
    return ""


def conversation_digest(system: Any, messages: Any) -> str:
    """Which conversation of a session this is: its system prompt and its first user message."""
    first_user = next((m for m in messages or () if _field(m, "role") == "user"), None)
    digest = hashlib.blake2b(digest_size=6)
    for part in (_text_of(system), _text_of(_field(first_user, "content"))):
        digest.update(part[:DIGEST_INPUT_CHARS].encode("utf-8", "replace"))
        digest.update(b"\x00")
    return digest.hexdigest()


def program_params(*, session_header: Any, metadata: Any, system: Any, messages: Any, tools: Any) -> Optional[dict]:
    """The ``custom_params`` to add to the converted chat request, or None: the client's own
    metadata keys where it sent any, else Claude Code's session as a program of the conversation.
    ``system`` should already be stripped of the attribution block."""
    explicit = merge_top_level(metadata, None) if isinstance(metadata, Mapping) else None
    params = dict(explicit or {})
    if any(key in params for key in PROGRAM_ID_ALIASES):
        return params
    session = session_of(session_header, metadata)
    if session is not None and tools:
        params[PROGRAM_ID_ALIASES[0]] = f"{PROGRAM_PREFIX}{session}/{conversation_digest(system, messages)}"
    elif any(key in params for key in LAST_STEP_ALIASES):
        params = {k: v for k, v in params.items() if k not in LAST_STEP_ALIASES}  # ends nothing
    return params or None
