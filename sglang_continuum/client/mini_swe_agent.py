"""mini-swe-agent (2.4.x) models that tell a continuum server which program each request is.

mini-swe-agent builds one model object per agent run (``mini-extra swebench`` does so per
instance), so the model is where a run's program id lives: each instance gets a fresh id, sent as
``custom_params.program_id`` and ``session_id`` in the body and as the router's routing header.
When the run is over (the model object goes, or ``close()``), ``/close_session`` ends the program
on the server at once; the server also ends it by itself when the agent submits. Select with
``model.model_class`` in a mini-swe-agent config; ``CONFIG_PATH`` (shipped with the package, its path
printed by ``python -m sglang_continuum.client.mini_swe_agent``) is one that does:

    model_class: sglang_continuum.client.mini_swe_agent.ContinuumLitellmModel          # tool calls
    model_class: sglang_continuum.client.mini_swe_agent.ContinuumLitellmTextbasedModel # text mode
"""

from __future__ import annotations

import uuid
import weakref
from pathlib import Path
from typing import Optional

import httpx
from minisweagent.models.litellm_model import LitellmModel
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

from sglang_continuum.client.params import RELEASE_PATH, continuum_custom_params, release_body, routing_headers
from sglang_continuum.core.metadata import LAST_STEP_KEY, STEP_KEY

CONFIG_PATH = Path(__file__).with_name("mini_swe_agent.yaml")


def release_program(server_url: str, program_id: str) -> None:
    """``POST /close_session`` for ``program_id``; never raises (a run's end must not fail on it)."""
    try:
        # the routing key: behind SGLang's router the release reaches the worker that holds the pin
        httpx.post(
            server_url.rstrip("/") + RELEASE_PATH,
            json=release_body(program_id),
            headers=routing_headers(program_id),
            timeout=30,
        )
    except httpx.HTTPError:
        pass


def _server_url(api_base: Optional[str]) -> Optional[str]:
    """``http://host:port/v1`` -> ``http://host:port`` (SGLang's native routes live at the root)."""
    if not api_base:
        return None
    base = api_base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class _ContinuumProgram:
    """Mixin over a litellm-based mini-swe-agent model: one program id per model object."""

    def __init__(self, *, program_id: Optional[str] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.program_id = program_id or f"msa-{uuid.uuid4().hex[:16]}"
        model_kwargs = dict(self.config.model_kwargs)
        body = dict(model_kwargs.get("extra_body") or {})
        body["custom_params"] = {**(body.get("custom_params") or {}), **continuum_custom_params(self.program_id)}
        body["session_id"] = self.program_id
        model_kwargs["extra_body"] = body
        model_kwargs["extra_headers"] = {
            **(model_kwargs.get("extra_headers") or {}),
            **routing_headers(self.program_id),
        }
        self.config.model_kwargs = model_kwargs
        url = _server_url(model_kwargs.get("api_base"))
        # when the run's model object is dropped (CPython: at once) the program is released
        self._release = weakref.finalize(self, release_program, url, self.program_id) if url else None

    def mark_last_step(self, last: bool, *, step: Optional[int] = None) -> None:
        """The next request is the program's last turn (e.g. the step limit makes it so); ``step``
        is its 1-based position (workers count the programs whose every turn they served)."""
        custom = self.config.model_kwargs["extra_body"]["custom_params"]
        custom[LAST_STEP_KEY] = bool(last)
        if step is not None:
            custom[STEP_KEY] = int(step)

    def close(self) -> None:
        """End the program on the server now (idempotent)."""
        if self._release is not None:
            self._release()


class ContinuumLitellmModel(_ContinuumProgram, LitellmModel):
    """mini-swe-agent v2's default model (native ``bash`` tool calls), with a program id."""


class ContinuumLitellmTextbasedModel(_ContinuumProgram, LitellmTextbasedModel):
    """mini-swe-agent v2's text mode (```` ```mswea_bash_command ```` blocks), with a program id."""


if __name__ == "__main__":  # the config's path, for mini-swe-agent's ``-c``
    print(CONFIG_PATH)
