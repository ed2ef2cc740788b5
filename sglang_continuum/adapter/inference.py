"""Program identity inferred from the prefix (``infer_programs``): the adapter side.

Only requests that carry no program id reach this code (a request with an explicit id pays one
``if``). At arrival, the request's prompt ids (SGLang's ``Req.origin_input_ids``, an
``array('q')`` hashed without a copy) are matched against the contexts of finished turns
(``core/program_inference.py``). A request that continues one is a turn of that program: same
pins, budget, shedding and ending rules as any program id. A request that continues nothing opens
a new id, and its finished context is remembered under it for ``PROVISIONAL_TTL_S``, so that its
next turn, if one comes, continues it. Whether that first turn is already a program depends on the
traffic (``core/first_turns.py``): while most such requests were continued lately, it is (its first
tool gap is pinned like any later one, as an agent that sends ids gets); otherwise it is served
exactly as under FCFS (no program: no pin, no program order, no admission control), so
single-shot traffic never pays for pins. With ``program_scope_header`` a request only ever continues
a context its own scope recorded: each scope's fingerprints carry a salt of its own, keyed by a
secret of this process, so a tenant can neither join another's inferred program nor crowd its keys. A first turn taken as a program that is not continued
within the horizon first turns are watched for is single-shot after all: ``single_shot`` drops it
(its pin released), and its context stays provisional, so a late next turn still finds it.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Optional

from sglang_continuum.core.event_log import EventLog
from sglang_continuum.core.first_turns import FirstTurns
from sglang_continuum.core.metadata import INFERRED_PREFIX, SOURCE_FIRST_TURN, SOURCE_INFERRED, SOURCE_NONE, ProgramMeta
from sglang_continuum.core.program_inference import ProgramIndex

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

FIRST_TURN_ATTR = "_continuum_first_turn"  # the id a request that continued nothing opened
SALT_ATTR = "_continuum_scope_salt"  # its scope's salt: what it finishes is recorded under it
# how long a single request's context waits for a next turn to make it a program: longer than a
# tool call takes, far shorter than single-shot traffic takes to fill the index
PROVISIONAL_TTL_S = 300.0


def is_inferred(meta: ProgramMeta) -> bool:
    """The program id was made here (a continuation found by prefix, or a new inferred program)."""
    return meta.has_program and meta.source in (SOURCE_INFERRED, SOURCE_FIRST_TURN)


class ProgramInference:
    def __init__(
        self,
        alive: Callable[[str], bool],
        clock: Callable[[], float],
        *,
        event_log: Optional[EventLog] = None,
        single_shot: Callable[[str], None] = lambda program_id: None,
    ) -> None:
        self.index = ProgramIndex(prefix=INFERRED_PREFIX)  # ids no client can send (metadata.RESERVED_PREFIX)
        self._registered = alive
        self._clock = clock
        self._single_shot = single_shot
        # recorded, not (yet) a program -> when; oldest first, bounded in time and number
        self._provisional: OrderedDict[str, float] = OrderedDict()
        self.first_turns = FirstTurns()
        self._log = event_log
        self._salt_key = os.urandom(16)  # salts no client can compute, so none can aim a collision

    def salt(self, scope: Optional[str]) -> int:
        """The fingerprints' salt of ``scope`` (0 unscoped): one hash of a short string."""
        if scope is None:
            return 0
        digest = hashlib.blake2b(scope.encode("utf-8", "surrogatepass"), digest_size=8, key=self._salt_key)
        return int.from_bytes(digest.digest(), "little") or 1

    def alive(self, program_id: str) -> bool:
        """A recorded context may still be continued: its program is registered, or provisional."""
        return program_id in self._provisional or self._registered(program_id)

    def attribute(self, req: "Req", scope: Optional[str] = None) -> ProgramMeta:
        """The program ``req`` (no explicit id, sent under ``scope``) continues; else a new id, kept
        on the request, which is a new program's if first turns are lately continued, else nobody's
        (provisional)."""
        self.expire()
        salt = self.salt(scope)
        if salt:
            setattr(req, SALT_ATTR, salt)
        pid = self.index.match(req.origin_input_ids, self.alive, salt=salt)
        if pid is not None:
            self._provisional.pop(pid, None)  # it is a program now
            self.first_turns.continued(pid, self._clock())
            meta = ProgramMeta(pid, source=SOURCE_INFERRED)
        else:
            pid = self.index.new_program()
            setattr(req, FIRST_TURN_ATTR, pid)
            if self.first_turns.are_programs():
                meta = ProgramMeta(pid, source=SOURCE_FIRST_TURN)
            else:
                meta = ProgramMeta(None, source=SOURCE_NONE)
        if self._log is not None:
            self._log.attributed(req.rid, pid, meta.source)
        return meta

    def provisional_finished(self, req: "Req") -> None:
        """A request with no program finished with its KV in the tree: remember its context under
        its provisional id (bounded, oldest first), in case a next turn continues it."""
        pid = getattr(req, FIRST_TURN_ATTR, None)
        if pid is None:
            return
        self._record(pid, req)
        now = self._clock()
        self.first_turns.finished(pid, now)
        self._remember(pid, now)
        self.expire()

    def _remember(self, pid: str, now: float) -> None:
        latest = next(reversed(self._provisional.values()), 0.0)
        self._provisional[pid] = max(now, latest)  # kept in time order
        while len(self._provisional) > self.index.max_programs:
            self.index.forget(self._provisional.popitem(last=False)[0])

    def expire(self) -> None:
        """First turns resolved (those taken as programs and not continued are dropped), and
        provisional contexts past their time forgotten."""
        now = self._clock()
        for pid in self.first_turns.expire(now):
            if self._registered(pid):  # taken as a program from its first turn: single-shot after all
                self._single_shot(pid)
                if not self._registered(pid) and pid in self.index:
                    self._remember(pid, now)
        cutoff = now - PROVISIONAL_TTL_S
        provisional = self._provisional
        while provisional and next(iter(provisional.values())) < cutoff:
            self.index.forget(provisional.popitem(last=False)[0])

    def turn_finished(self, meta: ProgramMeta, req: "Req") -> None:
        """A turn of an inferred program finished with its KV in the tree: if its program goes on
        (no terminal tool ended it), remember where its context ended."""
        if getattr(req, FIRST_TURN_ATTR, None) == meta.program_id:  # a first turn taken as a program
            self.first_turns.finished(meta.program_id, self._clock())
        if not self._registered(meta.program_id):  # ended by this turn (terminal tool) or forgotten
            self.index.forget(meta.program_id)
            return
        self._record(meta.program_id, req)

    def _record(self, program_id: str, req: "Req") -> None:
        prompt = len(req.origin_input_ids)
        try:
            context = req.origin_input_ids + req.output_ids  # array('q') in SGLang 0.5.23
        except TypeError:
            context = list(req.origin_input_ids) + list(req.output_ids)
        if prompt > 0:
            self.index.record(program_id, context, prompt, len(context), salt=getattr(req, SALT_ATTR, 0))

    def check_integrity(self) -> None:
        self.index.check_integrity()
        self.first_turns.check_integrity()
        assert len(self._provisional) <= self.index.max_programs, "provisional programs over the bound"
        times = list(self._provisional.values())
        assert all(a <= b for a, b in zip(times, times[1:])), "provisional records out of time order"
