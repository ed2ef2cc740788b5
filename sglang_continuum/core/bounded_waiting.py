"""Bounded waiting: when a waiting request becomes overdue (``docs/bounded-waiting.md``).

Program-level FCFS lets earlier programs' turns overtake a late program's request. A request is
overdue once ``budget`` requests that arrived after it were admitted ahead of it: a bound in the
engine's own pace (seconds on a fast engine, longer when it slows down). Overtakes are counted in
prefill work, each admission relative to the recent mean: what an overtake costs the request it
passes is the time the engine spends prefilling it, and one 15k-token re-prefill delays a late
turn as long as ten 1.5k-token turns do (recorded agents mix such contexts, and counting requests
let two programs that re-prefilled the whole pool in turn hold a small late turn for minutes).

The budget is what fairness lends to locality: earlier programs go first so that their contexts
are still there when they come back. While the pool keeps locality the budget is
``max_overtakes``. When it thrashes anyway (returning programs lose more than ``THRASH_LOSS`` of
their contexts, ``ReturnLossMeter``) being overtaken buys the late request nothing, so the budget
falls linearly with the return loss to ``MIN_OVERTAKES`` (everything lost). A tighter budget
spreads service and can raise the loss further, so the floor is the one measured not to cost
where the pool thrashes. A program's first turn keeps ``max_overtakes``: while the pool thrashes,
keeping new programs at the door is the load control it needs most. A request's budget is fixed
when it enters the queue, so its key changes only at events the adapter's incremental order knows
(``adapter/schedule_policy.py``).
"""

from __future__ import annotations

from typing import Optional

from sglang_continuum.core.return_loss import ReturnLossMeter
from sglang_continuum.core.turns import TurnTag

# The pool thrashes when returning programs lose more than half of their contexts; below that the
# budget stays at max_overtakes.
THRASH_LOSS = 0.5
MIN_OVERTAKES = 2  # the budget when returning programs find none of their contexts (>= 1: 0 means no bound)
WORK_WINDOW = 256  # admissions the mean prefill work per admission is taken over (exponentially)


class BoundedWaiting:
    def __init__(
        self,
        max_overtakes: int,
        return_loss: ReturnLossMeter,
        *,
        min_overtakes: int = MIN_OVERTAKES,
    ) -> None:
        if min_overtakes < 1:
            raise ValueError("min_overtakes must be >= 1 (a budget of 0 means no bound)")
        self.max_overtakes = max_overtakes
        self.min_overtakes = min_overtakes
        self.return_loss = return_loss
        # the clock overtakes are counted on: every admission advances it by its prefill work over
        # the mean (an average admission is one overtake)
        self.pace = 0.0
        self.mean_work: Optional[float] = None

    def admitted(self, work_tokens: int) -> None:
        """A request was admitted that prefills ``work_tokens`` (its prompt less its cached prefix)."""
        work = float(max(1, work_tokens))
        if self.mean_work is None:
            self.mean_work = work
        self.pace += work / self.mean_work
        self.mean_work += (work - self.mean_work) / WORK_WINDOW

    def budget(self, *, first_turn: bool = False) -> int:
        """Later arrivals that may be admitted ahead of a request entering the queue now (0: no
        bound); ``first_turn``: a program's first turn, which keeps the full budget."""
        k_max = self.max_overtakes
        if k_max <= 0 or first_turn:
            return k_max
        k_min = min(self.min_overtakes, k_max)
        loss = self.return_loss.ratio
        if not self.return_loss.ready or loss <= THRASH_LOSS:
            return k_max
        budget = k_max - round((k_max - k_min) * (loss - THRASH_LOSS) / (1.0 - THRASH_LOSS))
        assert k_min <= budget <= k_max, (budget, k_min, k_max)
        return budget

    def enter(self, tag: TurnTag, now: float, waiting_ahead: int) -> None:
        """``tag`` (re-)entered the queue behind ``waiting_ahead`` requests (those go first under FCFS
        too; each counted as an average admission): its wait starts now, and admissions beyond
        these overtake it. A retracted turn starts afresh (time spent running is not waiting)."""
        tag.queued_at = now
        tag.overtake_base = self.pace + max(0, waiting_ahead)
        tag.overtake_budget = self.budget(first_turn=tag.meta.has_program and tag.turn == 1)

    def overtaken(self, tag: TurnTag) -> float:
        """Later arrivals admitted ahead of ``tag`` so far, in average admissions (approximate)."""
        return max(0.0, self.pace - tag.overtake_base)

    def overdue_after(self, tag: TurnTag) -> Optional[float]:
        """The ``pace`` at which ``tag`` becomes overdue (None: no overtaking bound)."""
        k = tag.overtake_budget
        return tag.overtake_base + k if k > 0 else None

    def is_overdue(self, tag: TurnTag) -> bool:
        due = self.overdue_after(tag)
        return due is not None and self.pace >= due

    def check_integrity(self) -> None:
        assert self.pace >= 0.0 and (self.mean_work is None or self.mean_work >= 1.0), (self.pace, self.mean_work)
