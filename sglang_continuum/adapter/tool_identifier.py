"""Identify the tool a finished turn called, from its output tokens, inside the scheduler.

The scheduler holds the output token ids, not text: the tail of the output is decoded with the
scheduler's tokenizer and handed to ``core.tool_calls``. With ``--tool-call-parser NAME`` the
server's own detector for that format is tried first (it knows model-specific formats); it is
asked with a tool list that accepts any name, since the request's tool list stays in the
tokenizer process.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from sglang_continuum.core.tool_calls import from_openai_tool_calls, from_text, strip_thinking

logger = logging.getLogger(__name__)
TAIL_TOKENS = 2048  # a tool call sits at the end of a turn; bound the decode cost


class _AnyName(dict):
    def __contains__(self, key) -> bool:
        return True


def sglang_detector(parser_name: Optional[str]) -> Optional[Callable[[str], Optional[str]]]:
    if not parser_name:
        return None
    try:
        from sglang.srt.function_call.function_call_parser import FunctionCallParser

        detector = FunctionCallParser.ToolCallParserEnum[parser_name]()
    except Exception:  # unknown name or a parser that cannot be built here
        logger.warning("continuum: cannot use --tool-call-parser %s for tool names", parser_name)
        return None
    detector._get_tool_indices = lambda tools: _AnyName()

    def parse(text: str) -> Optional[str]:
        try:
            calls = detector.detect_and_parse(text, []).calls
        except Exception:
            return None
        if not calls or not calls[0].name:
            return None
        # the same refinement as for OpenAI tool_calls: bash -> bash:python, a submit -> submit
        call = {"function": {"name": calls[0].name, "arguments": calls[0].parameters}}
        return from_openai_tool_calls([call])

    return parse


def make_identifier(tokenizer, parser_name: Optional[str] = None) -> Callable[[object], Optional[str]]:
    if tokenizer is None:  # --skip-tokenizer-init: rely on client tool names
        return lambda req: None
    detector = sglang_detector(parser_name)

    def identify(req) -> Optional[str]:
        ids = list(req.output_ids[-TAIL_TOKENS:])
        if not ids:
            return None
        try:
            text = tokenizer.decode(ids, skip_special_tokens=False)
        except Exception:
            return None
        if detector is not None:
            name = detector(strip_thinking(text))
            if name:
                return name
        return from_text(text)

    return identify
