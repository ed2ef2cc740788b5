"""Reading Continuum's per-request state off SGLang's ``Req``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sglang_continuum.core.metadata import MalformedReporter, ProgramMeta, parse_program_meta
from sglang_continuum.core.turns import TurnTag

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

TAG_ATTR = "_continuum_tag"


def read_program_meta(req: "Req", report: MalformedReporter) -> ProgramMeta:
    """``req`` is a ``Req`` or a ``TokenizedGenerateReqInput`` (both carry ``session_id`` and
    ``routing_key``; the routing key is SGLang's, from ``X-SMG-Routing-Key`` or ``/generate``'s
    ``routing_key``)."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return parse_program_meta(
        params, getattr(req, "session_id", None), report, routing_key=getattr(req, "routing_key", None)
    )


def get_tag(req: "Req") -> Optional[TurnTag]:
    return getattr(req, TAG_ATTR, None)


def set_tag(req: "Req", tag: TurnTag) -> None:
    setattr(req, TAG_ATTR, tag)


def context_tokens(req: "Req") -> int:
    """Tokens of the request's context that the tree now holds (its protected path)."""
    return int(getattr(req.kv, "cache_protected_len", 0) or 0)
