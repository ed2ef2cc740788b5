"""Where each request is in SGLang's own lifecycle: the plugin's one record of which turns are live.

A request is live from the moment SGLang appends it to its waiting queue until it leaves SGLang
for good; meanwhile it waits or runs, and a retraction takes it from running back to waiting.
Each transition reaches the plugin on exactly one of SGLang 0.5.23's paths:

======================================  ==========================================================
transition                              SGLang path (what calls the plugin)
======================================  ==========================================================
enters the waiting queue                ``_add_request_to_queue`` appends it (the binding's
                                        wrapper finds it at the queue's tail; one SGLang rejects
                                        there -- queue limit, priority -- is never appended)
re-enters it after a retraction         ``update_running_batch`` -> ``retract_decode`` ->
                                        ``on_release`` (not finished) -> ``_add_request_to_queue``
admitted into a prefill batch           ``get_new_batch_prefill`` (the binding, per request)
aborted while waiting                   ``abort_request`` -> ``_release_aborted_request`` ->
                                        ``finish(ABORT)``
finishes, or is aborted, while running  ``release_kv_cache`` -> ``on_release`` (finished, or
                                        marked ``to_finish`` by a retraction that aborts it); a
                                        chunked request's abort calls ``finish(ABORT)`` first
======================================  ==========================================================

``ContinuumRadixCache`` turns these into the controller's events, so every turn that arrives
leaves exactly once, and the controller's count of each program's turns in flight is the number
of its live requests here (``check_integrity``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Optional

from sglang_continuum.core.turns import TurnTag


@dataclass(slots=True)
class LiveRequest:
    tag: TurnTag
    running: bool = False
    admitted: bool = False  # admitted at least once (a retracted turn is not admitted twice)


class RequestLifecycle:
    def __init__(self) -> None:
        self._live: dict[str, LiveRequest] = {}

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[tuple[str, LiveRequest]]:
        return iter(self._live.items())

    def get(self, rid: str) -> Optional[LiveRequest]:
        return self._live.get(rid)

    def entered(self, rid: str, tag: TurnTag) -> None:
        assert rid not in self._live, f"{rid} entered twice"
        self._live[rid] = LiveRequest(tag)

    def requeued(self, rid: str) -> LiveRequest:
        live = self._live[rid]
        live.running = False
        return live

    def admitted(self, rid: str, tag: Optional[TurnTag]) -> Optional[LiveRequest]:
        """``rid`` (the request carrying ``tag``) was taken into a prefill batch: its live record
        when this is its first admission, else None (re-admitted after a retraction, or not live:
        a request that reused a live request's rid is not that request)."""
        live = self._live.get(rid)
        if live is None or live.tag is not tag or live.running:
            return None
        live.running = True
        if live.admitted:
            return None
        live.admitted = True
        return live

    def left(self, rid: str, tag: Optional[TurnTag] = None) -> Optional[LiveRequest]:
        """``rid`` left SGLang (finished or aborted): its record, or None if it was not live (with
        ``tag``: the leaving request's, None when the live one under ``rid`` is another request)."""
        live = self._live.get(rid)
        if live is None or (tag is not None and live.tag is not tag):
            return None
        return self._live.pop(rid)

    def programs_in_flight(self) -> Counter:
        """Live requests per program state (the incarnation each arrived under)."""
        return Counter(id(live.tag.program) for live in self._live.values() if live.tag.program is not None)

    def check_integrity(self, sglang_live: Optional[set[str]] = None) -> None:
        """``sglang_live``: the rids SGLang holds (waiting queue, running batch, chunked request)."""
        if sglang_live is not None:
            assert set(self._live) == sglang_live, (
                f"live requests differ from SGLang's: plugin only {sorted(set(self._live) - sglang_live)[:5]}, "
                f"SGLang only {sorted(sglang_live - set(self._live))[:5]}"
            )
        for rid, live in self._live.items():
            assert live.admitted or not live.running, f"{rid} runs but was never admitted"
