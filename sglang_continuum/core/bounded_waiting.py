"""Bounded waiting: when a waiting request becomes overdue (``docs/bounded-waiting.md``).

Program-level FCFS lets earlier programs' turns overtake a late program's request. A request is
overdue once ``budget`` requests that arrived after it were admitted ahead of it (a bound in the
engine's own pace: seconds on a fast engine, longer when it slows down), or, optionally, once it
has waited ``max_queue_wait_s`` (an absolute ceiling, off by default).

The budget is what fairness lends to locality: earlier programs go first so that their contexts
are still there when they come back. While the pool keeps locality the budget is
``max_overtakes``. When it thrashes anyway (returning programs lose more than ``THRASH_LOSS`` of
their contexts, ``ReturnLossMeter``) being overtaken buys the late request nothing, so the budget
falls linearly with the return loss to ``min_overtakes`` (everything lost). A tighter budget
spreads service and can raise the loss further, so the floor is one measured not to cost where
the pool thrashes (2 by default; 1 was slower there). A program's first turn keeps
``max_overtakes``: an overdue first turn may pass admission control, and while the pool thrashes
keeping new programs at the door is the load control it needs most. A request's budget is fixed when it enters the queue, so its key changes only at
events the adapter's incremental order knows (``adapter/schedule_policy.py``).
"""

from __future__ import annotations

from typing import Optional

from sglang_continuum.core.counters import AdmissionCounters
from sglang_continuum.core.return_loss import ReturnLossMeter
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.turns import TurnTag

# The pool thrashes when returning programs lose more than half of their contexts; below that the
# budget stays at max_overtakes (at paper scale, emulated, 90% of returning turns see a return
# loss under 0.47; on the CPU starvation probe it is 0.85-1.0).
THRASH_LOSS = 0.5


class BoundedWaiting:
    def __init__(self, settings: ContinuumSettings, admission: AdmissionCounters, return_loss: ReturnLossMeter) -> None:
        self.settings = settings
        self.admission = admission  # its ``admitted`` is the clock overtakes are counted on
        self.return_loss = return_loss

    def budget(self, *, first_turn: bool = False) -> int:
        """Later arrivals that may be admitted ahead of a request entering the queue now (0: no
        bound); ``first_turn``: a program's first turn, which keeps the full budget."""
        k_max = self.settings.max_overtakes
        if k_max <= 0 or first_turn:
            return k_max
        k_min = min(self.settings.min_overtakes, k_max)
        loss = self.return_loss.ratio
        if not self.return_loss.ready or loss <= THRASH_LOSS:
            return k_max
        budget = k_max - round((k_max - k_min) * (loss - THRASH_LOSS) / (1.0 - THRASH_LOSS))
        assert k_min <= budget <= k_max, (budget, k_min, k_max)
        return budget

    def enter(self, tag: TurnTag, now: float, waiting_ahead: int) -> None:
        """``tag`` (re-)entered the queue behind ``waiting_ahead`` requests (those go first under FCFS
        too): its wait starts now, and admissions beyond these overtake it. A retracted turn
        starts afresh (time spent running is not waiting)."""
        tag.queued_at = now
        tag.overtake_base = self.admission.admitted + max(0, waiting_ahead)
        tag.overtake_budget = self.budget(first_turn=tag.meta.has_program and tag.turn == 1)

    def overtaken(self, tag: TurnTag) -> int:
        """Later arrivals admitted ahead of ``tag`` so far (approximate)."""
        return max(0, self.admission.admitted - tag.overtake_base)

    def overdue_after(self, tag: TurnTag) -> Optional[int]:
        """The admission count at which ``tag`` becomes overdue (None: no overtaking bound)."""
        k = tag.overtake_budget
        return tag.overtake_base + k if k > 0 else None

    def overdue_at(self, tag: TurnTag) -> Optional[float]:
        """The time at which ``tag`` becomes overdue (None: no absolute ceiling)."""
        limit = self.settings.max_queue_wait_s
        return tag.queued_at + limit if limit > 0 else None

    def is_overdue(self, tag: TurnTag, now: float) -> bool:
        due = self.overdue_after(tag)
        if due is not None and self.admission.admitted >= due:
            return True
        at = self.overdue_at(tag)
        return at is not None and now >= at
