"""Bounded waiting: when a waiting request becomes overdue (``docs/bounded-waiting.md``).

Program-level FCFS lets earlier programs' turns overtake a late program's request. A request is
overdue once ``budget`` requests that arrived after it were admitted ahead of it: a bound in the
engine's own pace (seconds on a fast engine, longer when it slows down). Overtakes are counted in
prefill work, in units of the recent mean prompt: an admission that prefills a prompt of average
length from scratch is one overtake (as counting requests had it), a return that finds its
context cached a fraction of one, and a re-prefill of a context ten times the mean ten. What an
overtake costs the request it passes is the engine's time on its prefill: counted in requests,
two programs that re-prefilled the whole pool in turn held small late turns for minutes
(recorded agents mix such contexts). The unit is the mean prompt, not the mean prefill: where
returns mostly hit, the mean prefill is a small append, against which a re-prefill of an ordinary
context would count as several overtakes and make waiting turns overdue where program order is
what keeps those contexts.

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
PROMPT_WINDOW = 256  # admissions the mean prompt is taken over (exponentially)
_PROMPT_DECAY = 1.0 - 1.0 / PROMPT_WINDOW


class BoundedWaiting:
    def __init__(self, max_overtakes: int, *, min_overtakes: int = MIN_OVERTAKES) -> None:
        if min_overtakes < 1:
            raise ValueError("min_overtakes must be >= 1 (a budget of 0 means no bound)")
        self.max_overtakes = max_overtakes
        self.min_overtakes = min_overtakes
        self.return_loss = ReturnLossMeter()  # the thrash signal the budget follows
        # the clock overtakes are counted on: every admission advances it by its prefill work over
        # the mean prompt (an average prompt prefilled from scratch is one overtake)
        self.overtake_clock = 0.0
        # the mean is a ratio of decayed sums (an exponential average corrected for its start):
        # seeded by one sample, as a plain exponential average is, a server's first request (a
        # 1-token health probe) would make every admission of its first hundreds count as hundreds
        self._prompt_sum = 0.0
        self._prompt_weight = 0.0

    @property
    def mean_prompt(self) -> Optional[float]:
        """Prompt tokens per admission over about the last ``PROMPT_WINDOW`` (None before any)."""
        return self._prompt_sum / self._prompt_weight if self._prompt_weight else None

    def observe_return(self, previous_tokens: int, context_tokens: int, cached_tokens: int) -> None:
        """A returning turn was admitted with ``cached_tokens`` of its ``context_tokens`` prompt
        cached; its program had ``previous_tokens`` when its last turn finished (only what this
        prompt still extends counts: a client that cut its history lost nothing to the pool)."""
        self.return_loss.observe(min(previous_tokens, context_tokens), cached_tokens)

    def admitted(self, prompt_tokens: int, cached_tokens: int = 0) -> None:
        """A request with ``prompt_tokens`` was admitted and found ``cached_tokens`` of them cached:
        it prefills the rest."""
        prompt = float(max(1, prompt_tokens))
        work = max(1.0, prompt - cached_tokens)
        self._prompt_sum = self._prompt_sum * _PROMPT_DECAY + prompt
        self._prompt_weight = self._prompt_weight * _PROMPT_DECAY + 1.0
        self.overtake_clock += work / (self._prompt_sum / self._prompt_weight)

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

    def entry(self, tag: TurnTag, waiting_ahead: int) -> tuple[float, int]:
        """``tag`` (re-)enters the queue behind ``waiting_ahead`` requests (those go first under FCFS
        too; each counted as one overtake): the overtaking clock beyond which admissions overtake
        it, and its budget of overtakes. A retracted turn starts afresh (time spent running is not
        waiting)."""
        base = self.overtake_clock + max(0, waiting_ahead)
        return base, self.budget(first_turn=tag.meta.has_program and tag.turn == 1)

    def overtaken(self, tag: TurnTag) -> float:
        """Later arrivals admitted ahead of ``tag`` so far, in overtakes (approximate)."""
        return max(0.0, self.overtake_clock - tag.overtake_base)

    def overdue_after(self, tag: TurnTag) -> Optional[float]:
        """The ``overtake_clock`` at which ``tag`` becomes overdue (None: no overtaking bound)."""
        k = tag.overtake_budget
        return tag.overtake_base + k if k > 0 else None

    def is_overdue(self, tag: TurnTag) -> bool:
        due = self.overdue_after(tag)
        return due is not None and self.overtake_clock >= due

    def check_integrity(self) -> None:
        mean = self.mean_prompt
        assert self.overtake_clock >= 0.0 and (mean is None or mean >= 1.0 - 1e-9), (self.overtake_clock, mean)
        assert 0.0 <= self._prompt_weight <= PROMPT_WINDOW + 1e-9, self._prompt_weight
        self.return_loss.check_integrity()
