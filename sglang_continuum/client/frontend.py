"""``ContinuumRuntimeEndpoint``: SGLang frontend-language programs carry a program id.

Every run of an ``@sgl.function`` is a ``StreamExecutor`` with its own id; each ``/generate`` it
sends is tagged with that id (or with the ``program_id`` argument of the function, if it has one).
When the run ends (SGLang calls ``end_program`` when the program state is dropped),
``POST /close_session`` with the program id releases the program's pins at once instead of
letting them run out their TTL (``release_on_end=False`` turns that off).
"""

from __future__ import annotations

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint, http_request
from sglang.lang.interpreter import StreamExecutor

from sglang_continuum.client.params import RELEASE_PATH, continuum_custom_params, release_body


def program_id_of(s: StreamExecutor) -> str:
    explicit = (s.arguments or {}).get("program_id") if isinstance(s.arguments, dict) else None
    return str(explicit) if explicit is not None else s.sid


class ContinuumRuntimeEndpoint(RuntimeEndpoint):
    def __init__(self, *args, release_on_end: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release_on_end = release_on_end
        self._sent: set[str] = set()

    def _add_images(self, s: StreamExecutor, data) -> None:
        super()._add_images(s, data)  # runs before every /generate of this backend
        pid = program_id_of(s)
        sp = data.setdefault("sampling_params", {})
        sp["custom_params"] = {**(sp.get("custom_params") or {}), **continuum_custom_params(pid)}
        self._sent.add(pid)

    def end_program(self, s) -> None:
        for executor in s if isinstance(s, list) else [s]:
            pid = program_id_of(executor)
            if self.release_on_end and pid in self._sent:
                self._sent.discard(pid)
                http_request(
                    self.base_url + RELEASE_PATH, json=release_body(pid), api_key=self.api_key, verify=self.verify
                )
        super().end_program(s)
