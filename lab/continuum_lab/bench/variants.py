"""The paper's ablations as rule compositions (``sglang_continuum.core.rules.Rules``).

A server runs one by name: ``SGLANG_CONTINUUM_RULES=continuum_lab.bench.variants:PINS_ONLY``
(``bench/policies.py`` does this for each named policy), or a parameterised one:
``continuum_lab.bench.variants:fixed_ttl(seconds=5, program_idle_timeout_s=20)`` (tests and the
reliability probes: a fixed TTL and short lifetimes make "back to empty" reachable in seconds).
Each is the product's default with one rule swapped; none is the default itself.
"""

from __future__ import annotations

from functools import partial

from continuum_lab.bench.ttl_baselines import BernsteinTTL, FixedTTL, ReferenceTTL
from sglang_continuum.core.applications import ApplicationRanks
from sglang_continuum.core.door import Door
from sglang_continuum.core.engine_time import MIN_BUSY_S, EngineTime
from sglang_continuum.core.priority import RETRACTED, WAITING, QueueKey, Waiting
from sglang_continuum.core.residency import BINDING_S, Residency
from sglang_continuum.core.rules import Rules, Timings
from sglang_continuum.core.shedding import Shedding


def request_fcfs(w: Waiting) -> QueueKey:
    """SGLang's fcfs (retracted requests first, then arrival): pins without program-level order."""
    return (RETRACTED if w.retracted else WAITING, w.request_rank, 0)


def fixed_ttl(seconds: float, **timings: float) -> Rules:
    """Every non-final turn pinned for ``seconds`` (the paper's static-TTL rung); ``timings``:
    ``core.rules.Timings`` fields other than the default's."""
    return Rules(f"fixed-{seconds:g}s", ttl_model=partial(FixedTTL, ttl_s=seconds), timings=Timings(**timings))


def timed(**timings: float) -> Rules:
    """The product's rules on other time scales (``core.rules.Timings`` fields): tests and probes
    that must see a save, an expiry or a forgotten program within seconds."""
    return Rules("continuum-timed", timings=Timings(**timings))


class WithoutResidency(Residency):
    """The door as it was before residency: the TTL model alone prices pins while it binds, a
    return whose context is gone is re-prefilled at once (never paused), and room for growth is
    always reserved."""

    def resident_ttl(self, tool: str, now: float, context_tokens: int) -> float:
        return 0.0

    def pauses(self, tag, state) -> bool:
        return False

    def _price_growth(self) -> None:
        self.working_set.reserve_growth = True


class WithoutPausing(Residency):
    """Residency's pins without its pauses: a return whose context is gone is re-prefilled at once."""

    def pauses(self, tag, state) -> bool:
        return False


class WithoutResidentPins(Residency):
    """Residency's pauses without its pins: the TTL model alone prices pins while the door binds."""

    def resident_ttl(self, tool: str, now: float, context_tokens: int) -> float:
        return 0.0


class DoorWithPauseBinding(Door):
    """A held paused return binds the door as a held first turn does, once no first turn has been
    held for ``after_s``: just past the fit every program is admitted, so no first turn waits and
    the door never binds, yet returns find their contexts gone; the admitted programs alone
    overflow the pool, and binding keeps the resident ones through their tools. Mixed where first
    turns wait (``docs/results/residency/``), so not the default."""

    after_s = 60.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first_held_at = float("-inf")

    def holds_back(self, tag, state, request_tokens, capacity_tokens, *, behind_overdue=False, now=0.0, **room) -> bool:
        held = super().holds_back(
            tag, state, request_tokens, capacity_tokens, behind_overdue=behind_overdue, now=now, **room
        )
        if held and not behind_overdue:  # weighed against the room (a later turn held is a pause)
            if state.turns_admitted == 0:
                self.first_held_at = now
            elif now - self.first_held_at >= self.after_s:
                self.residency.binding_until = now + BINDING_S
        return held


class WithoutReleaseLoss(Residency):
    """Residency priced as if every context let go were lost: the price before it read what the
    programs let go at their turn's end found gone when they came back."""

    def release_loss(self) -> float:
        return 1.0


class _EveryPlaceDecodes(EngineTime):
    @property
    def decode_share(self) -> float:
        return 1.0


class WithoutDecodeShare(Residency):
    """Residency priced as if the engine only decoded: a batch place costs its whole share of the
    engine's time, whatever the engine spends prefilling."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.engine = _EveryPlaceDecodes()


class PricedFirstTurns(Residency):
    """The door weighs a first turn only while keeping a context of the expected final size pays
    (growth reserved), with a host tier or without: past the pool, what a new program costs the
    admitted ones is their rebuilds (SGLang evicts the KV of programs out on a tool before it
    retracts a running turn), which residency already prices."""

    def holds_first_turns(self) -> bool:
        return self.working_set.reserve_growth


class MarginalRebuild(Residency):
    """A rebuild priced without the prefill step's fixed cost (the profile's ``c0``): a return
    runs a prefill step for its new tokens whether its context is kept or not."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        full = self.rebuild_s
        if full is not None:
            self.rebuild_s = lambda tokens: max(0.0, full(tokens) - full(0))


class PricedFirstTurnsMarginalRebuild(MarginalRebuild, PricedFirstTurns):
    """Both of the above."""


class _StepCostShared(EngineTime):
    """An empty batch place priced at every part of a step that does not grow with the batch: the
    decode steps, and each prefill step's fixed cost (the engine's fit's ``c0``, shared by whatever
    the step prefills)."""

    @property
    def decode_share(self) -> float:
        share = super().decode_share
        c = self.prefill.coefficients()
        if self.busy_s < MIN_BUSY_S or c is None:
            return share
        return min(1.0, share + float(c[0]) * self.prefill.steps / self.busy_s)


class SharedStepCost(MarginalRebuild):
    """A step's fixed cost counted where it falls: not in a rebuild (a return runs a prefill step
    whether its context was kept or not: ``MarginalRebuild``), but in what an empty batch place
    costs (a step runs at that cost however few it carries). On an engine whose steps cost mostly
    their fixed part (the CPU server's profile: 40 ms a step, about 7,800 tokens' linear cost),
    keeping then pays only for contexts dear to rebuild."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.engine = _StepCostShared()


class ProgramRanksOnly(ApplicationRanks):
    """Program-level FCFS alone: an application's agents rank by their own arrival."""

    def rank(self, app_id, rank: int, now: float) -> int:
        return rank


class BoundShedsOldest(Shedding):
    """For a turn past its hold bound (or any shed at no rank: an idle engine, an allocation), the
    pin shed is that of the program served most turns since this rule last released it (the
    longest resident), not the latest program's: residents take turns round the pool instead of
    the newest giving its place up again and again. Spared pins are shed last, as the default's
    bound does with a waiting return's."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._released_at_turn: dict[str, int] = {}  # program -> its turns_admitted when last released

    def victim(self, now, *, ranked_after=None, keep=None, spares=(None,)):
        if ranked_after is not None:
            return super().victim(now, ranked_after=ranked_after, keep=keep, spares=spares)
        if None not in spares:
            spares = (*spares, None)
        for spare in spares:
            pins = [p for p in self.pins if p.program_id != keep and (spare is None or not spare(p.program_id))]
            if pins:
                longest = max(pins, key=self._turns_resident)
                state = self.programs.get(longest.program_id)
                if len(self._released_at_turn) > 4096:
                    self._released_at_turn = {k: v for k, v in self._released_at_turn.items() if k in self.programs}
                self._released_at_turn[longest.program_id] = state.turns_admitted if state is not None else 0
                return self.pins.pop(longest.program_id), False
        return None

    def _turns_resident(self, pin) -> tuple[int, int]:
        state = self.programs.get(pin.program_id)
        served = state.turns_admitted if state is not None else 0
        return served - self._released_at_turn.get(pin.program_id, 0), -pin.arrival_rank


PINS_ONLY = Rules("pins-only", order=request_fcfs)
NO_APPLICATION_RANKS = Rules("no-application-ranks", applications=ProgramRanksOnly)
NO_RESIDENCY = Rules("no-residency", residency=WithoutResidency)
NO_PAUSING = Rules("no-pausing", residency=WithoutPausing)
NO_RESIDENT_PINS = Rules("no-resident-pins", residency=WithoutResidentPins)
NO_DECODE_SHARE = Rules("no-decode-share", residency=WithoutDecodeShare)
NO_RELEASE_LOSS = Rules("no-release-loss", residency=WithoutReleaseLoss)
PAUSE_BINDS = Rules("pause-binds", door=DoorWithPauseBinding)
PRICED_DOOR = Rules("priced-door", residency=PricedFirstTurns)
MARGINAL_REBUILD = Rules("marginal-rebuild", residency=MarginalRebuild)
PRICED_DOOR_MARGINAL = Rules("priced-door-marginal", residency=PricedFirstTurnsMarginalRebuild)
SHARED_STEP_COST = Rules("shared-step-cost", residency=SharedStepCost)
FIXED_2S = fixed_ttl(2.0)
REFERENCE = Rules("reference", ttl_model=ReferenceTTL)  # the public vLLM reference's 2 s rule
BERNSTEIN = Rules("bernstein", ttl_model=BernsteinTTL)  # the paper's first version
BOUND_SHEDS_OLDEST = Rules("bound-sheds-oldest", shedding=BoundShedsOldest)
