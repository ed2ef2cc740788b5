"""Program identity inferred from the prefix (``infer_programs``): the adapter side.

Only requests that carry no program id reach this code (a request with an explicit id pays one
``if``). At arrival, the request's prompt ids (SGLang's ``Req.origin_input_ids``, an
``array('q')`` hashed without a copy) are matched against the contexts of finished turns of
inferred programs (``core/program_inference.py``); when a non-final turn of an inferred program
finishes, its prompt + output ids are recorded. The choice is the controller's to use like any
program id: same pins, budget, shedding and ending rules.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

import orjson

from sglang_continuum.core.metadata import SOURCE_INFERRED, SOURCE_NONE, ProgramMeta
from sglang_continuum.core.program_inference import ProgramIndex
from sglang_continuum.core.settings import ContinuumSettings

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

logger = logging.getLogger(__name__)


def is_inferred(meta: ProgramMeta) -> bool:
    """The program id was made here (a continuation found by prefix, or a new inferred program)."""
    return meta.has_program and meta.source in (SOURCE_INFERRED, SOURCE_NONE)


class ProgramInference:
    def __init__(self, settings: ContinuumSettings, alive: Callable[[str], bool], *, write_log: bool = True) -> None:
        self.index = ProgramIndex(
            divergence_tokens=settings.infer_divergence_tokens, max_programs=settings.max_programs
        )
        self.alive = alive
        self._log = None
        if settings.attribution_log and write_log:
            self._log = open(settings.attribution_log, "ab", buffering=0)  # one write per line: readable while serving

    def attribute(self, req: "Req") -> ProgramMeta:
        """The program ``req`` (no explicit id) continues, or a new inferred program."""
        pid = self.index.match(req.origin_input_ids, self.alive)
        if pid is not None:
            meta = ProgramMeta(pid, source=SOURCE_INFERRED)
        else:
            meta = ProgramMeta(self.index.new_program(), source=SOURCE_NONE)
        if self._log is not None:
            self._write(req.rid, meta)
        return meta

    def turn_finished(self, meta: ProgramMeta, req: "Req") -> None:
        """A turn of an inferred program finished with its KV in the tree: if its program goes on
        (no terminal tool ended it), remember where its context ended."""
        if not self.alive(meta.program_id):
            self.index.forget(meta.program_id)
            return
        prompt = len(req.origin_input_ids)
        try:
            context = req.origin_input_ids + req.output_ids  # array('q') in SGLang 0.5.23
        except TypeError:
            context = list(req.origin_input_ids) + list(req.output_ids)
        if prompt > 0:
            self.index.record(meta.program_id, context, prompt, len(context))

    def _write(self, rid: Optional[str], meta: ProgramMeta) -> None:
        try:
            line = {"rid": rid, "program_id": meta.program_id, "source": meta.source}
            self._log.write(orjson.dumps(line) + b"\n")
        except (OSError, TypeError):  # a debugging aid must never take serving down
            logger.exception("continuum: attribution log write failed; logging off")
            self._log = None

    def check_integrity(self) -> None:
        self.index.check_integrity()
