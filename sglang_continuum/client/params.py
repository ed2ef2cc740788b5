"""Metadata helpers: what an agent client sends so the server knows each turn's program."""

from __future__ import annotations

from typing import Any, Optional

from sglang_continuum.core.metadata import (
    APP_ID_KEY,
    CRITICAL_KEY,
    LAST_STEP_KEY,
    PROGRAM_ID_KEY,
    STEP_KEY,
    TOOL_NAME_KEY,
    TOOL_TIME_KEY,
)

# SGLang's router (sgl-model-gateway) hashes this header for consistent, program-affine routing.
ROUTING_HEADER = "x-smg-routing-key"
# SGLang's own route; on a continuum server it ends the program named by ``session_id`` (its
# pins are released at once). Call it when the run is over and no turn said ``is_last_step``.
RELEASE_PATH = "/close_session"


def release_body(program_id: str | int) -> dict:
    """The JSON body of ``POST /close_session`` that ends ``program_id`` on a continuum server."""
    return {"session_id": str(program_id)}


def continuum_custom_params(
    program_id: str | int,
    *,
    last_step: bool = False,
    tool_name: Optional[str] = None,
    step: Optional[int] = None,
    tool_time_s: Optional[float] = None,
    app_id: Optional[str] = None,
    critical: Optional[bool] = None,
) -> dict:
    """``step`` (the turn's 1-based position) lets workers count programs whose every turn they
    served (``sglang:continuum_programs_affine_total``): how well routing kept programs together.
    ``tool_time_s``: how long the tool this turn's output calls should take (the server blends it
    with what it learned); ``app_id`` / ``critical``: the multi-agent application the program
    belongs to and whether it is on that application's critical path."""
    params: dict[str, Any] = {PROGRAM_ID_KEY: str(program_id), LAST_STEP_KEY: bool(last_step)}
    if tool_name:
        params[TOOL_NAME_KEY] = tool_name
    if step is not None:
        params[STEP_KEY] = int(step)
    if tool_time_s is not None:
        params[TOOL_TIME_KEY] = float(tool_time_s)
    if app_id is not None:
        params[APP_ID_KEY] = str(app_id)
    if critical is not None:
        params[CRITICAL_KEY] = bool(critical)
    return params


# continuum_custom_params' keywords: continuum_extra_body hands these to it, the rest to SGLang
METADATA_ARGS = ("last_step", "tool_name", "step", "tool_time_s", "app_id", "critical")


def continuum_extra_body(program_id: str | int, **fields: Any) -> dict:
    """``extra_body`` for the OpenAI client: the ``METADATA_ARGS`` among ``fields`` go to
    ``continuum_custom_params``, the others are SGLang fields of the body (e.g. ignore_eos)."""
    meta = {name: fields.pop(name) for name in METADATA_ARGS if name in fields}
    body = dict(fields)
    custom = dict(body.pop("custom_params", None) or {})
    custom.update(continuum_custom_params(program_id, **meta))
    body["custom_params"] = custom
    return body


def routing_headers(program_id: str | int) -> dict[str, str]:
    return {ROUTING_HEADER: str(program_id)}
