"""Program metadata for SGLang's Anthropic Messages endpoint (``/v1/messages``, Claude Code's API).

SGLang's ``AnthropicServing.handle_messages`` converts the request to a chat completion
(``_convert_to_chat_completion_request``) and calls the chat handler's internals, so neither the
OpenAI path's hook nor the request's Anthropic fields reach ``custom_params``. Two hooks, both in
the HTTP process and both inert under any other policy:

* ``handle_messages`` (AROUND) strips Claude Code's attribution block from the system prompt and
  works out the request's program metadata (``core/anthropic_messages.py``) from its headers and
  body, for the conversion below; the task-local variable keeps concurrent requests apart;
* ``_convert_to_chat_completion_request`` (AROUND) writes it into the chat request's
  ``custom_params``, which SGLang passes on to the scheduler (the sender's scope is added later,
  as on every path, by the ``generate_request`` hook).
"""

from __future__ import annotations

import contextvars
import logging

from sglang_continuum import POLICY_NAME

logger = logging.getLogger(__name__)

HANDLE_MESSAGES = "sglang.srt.entrypoints.anthropic.serving.AnthropicServing.handle_messages"
CONVERT_MESSAGES = "sglang.srt.entrypoints.anthropic.serving.AnthropicServing._convert_to_chat_completion_request"

_params: contextvars.ContextVar = contextvars.ContextVar("continuum_messages_params", default=None)


def _serves_continuum(serving) -> bool:
    manager = getattr(getattr(serving, "openai_serving_chat", None), "tokenizer_manager", None)
    return getattr(getattr(manager, "server_args", None), "schedule_policy", None) == POLICY_NAME


def _read_request(request, raw_request):
    """Strip the attribution block in place; the request's program metadata, or None."""
    from sglang_continuum.core.anthropic_messages import SESSION_HEADER, program_params, strip_attribution

    system = strip_attribution(request.system)
    if system is not request.system:
        request.system = system
    headers = getattr(raw_request, "headers", None)
    return program_params(
        session_header=headers.get(SESSION_HEADER) if headers is not None else None,
        metadata=request.metadata,
        system=system,
        messages=request.messages,
        tools=request.tools,
    )


async def around_handle_messages(original, serving, request, raw_request, *args, **kwargs):
    if not _serves_continuum(serving):
        return await original(serving, request, raw_request, *args, **kwargs)
    try:
        params = _read_request(request, raw_request)
    except Exception:  # served as SGLang would, without program metadata
        logger.exception("continuum: reading an Anthropic Messages request's program metadata failed")
        params = None
    token = _params.set(params)
    try:
        return await original(serving, request, raw_request, *args, **kwargs)
    finally:
        _params.reset(token)


def around_convert(original, serving, anthropic_request, *args, **kwargs):
    chat_request = original(serving, anthropic_request, *args, **kwargs)
    params = _params.get()
    if params:
        try:  # keys the chat request already carries win, as on the OpenAI path
            chat_request.custom_params = {**params, **(chat_request.custom_params or {})}
        except Exception:
            logger.exception("continuum: adding program metadata to a converted Messages request failed")
    return chat_request
