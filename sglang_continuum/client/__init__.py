"""Client-side helpers: how an agent tells the server which program a turn belongs to.

Metadata keys (in ``custom_params``; see docs/request-metadata.md):

* ``program_id`` (str or int): the agent program (one agent run). ``session_id`` is used when absent.
* ``is_last_step`` (bool): this turn is the program's last; nothing is pinned after it.
* ``tool_name`` (str, optional): the tool this turn's output calls, when the client knows it.

OpenAI client::

    client.chat.completions.create(..., extra_body=continuum_extra_body("run-17", last_step=False))

Native ``/generate``: put ``continuum_custom_params(...)`` under ``sampling_params.custom_params``.
Frontend language (``@sgl.function``): ``sgl.set_default_backend(ContinuumRuntimeEndpoint(url))``.
Router: send ``ROUTING_HEADER: program_id`` so every turn of a program lands on the same worker.
Ending a program after the fact: ``POST RELEASE_PATH`` with ``release_body(program_id)``.
Recipes for every client, each run by a test: docs/clients.md.
"""

from __future__ import annotations

from sglang_continuum.client.params import (
    RELEASE_PATH,
    ROUTING_HEADER,
    continuum_custom_params,
    continuum_extra_body,
    release_body,
    routing_headers,
)

__all__ = [
    "RELEASE_PATH",
    "ROUTING_HEADER",
    "continuum_custom_params",
    "continuum_extra_body",
    "release_body",
    "routing_headers",
    "ContinuumRuntimeEndpoint",
]


def __getattr__(name: str):
    if name == "ContinuumRuntimeEndpoint":  # imports sglang.lang only when asked for
        from sglang_continuum.client.frontend import ContinuumRuntimeEndpoint

        return ContinuumRuntimeEndpoint
    raise AttributeError(name)
