"""What the controller and the adapter exchange about one request or one step: the tag a
request carries while queued, its admission record, and the plans the controller answers with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.pins import Pin

if TYPE_CHECKING:
    from sglang_continuum.core.programs import ProgramState


@dataclass(slots=True)
class TurnTag:
    """What the adapter stores on a request when it arrives."""

    meta: ProgramMeta
    request_rank: int  # arrival order of this request
    # its program's place: its first turn's arrival order (== request_rank without a program); with
    # scoped ids, its fair rank between scopes (``scopes.py``)
    program_rank: int
    arrival: float = 0.0
    returning_miss: bool = False  # a later turn whose program held no pin when it arrived
    held_back: bool = False  # admission control kept it waiting at least once
    turn: int = 1  # its program's turns seen here so far, this one included (1 = first turn)
    context_gone: bool = False  # a return without a pin that found most of its context gone on arrival
    new_program: bool = True  # no turn of its program had been admitted when it arrived (or no program)
    lost_tokens: int = 0  # a return: what of its program's last context it found gone on arrival
    # The hold bound (``residency.py``): when a turn the door held stops being held (None: never
    # held, or no bound), whether that time came (the door lets it go), whether its hold ended.
    due_at: Optional[float] = None
    due: bool = False
    hold_ended: bool = False
    # Bounded waiting. ``queued_at``: when it (re-)entered the queue (a retraction restarts it).
    # ``overtake_base``: the overtaking clock (``BoundedWaiting.overtake_clock``) when it (re-)entered, plus
    # the requests already waiting then (those go first under FCFS too); the clock beyond that is
    # how far it was overtaken.
    # ``overtake_budget``: how many overtakes make it overdue, fixed when it (re-)entered so that
    # its key changes only at known events (0: no bound).
    queued_at: float = 0.0
    overtake_base: float = 0.0
    overtake_budget: int = 0
    # the program state it arrived under: its exit counts against that incarnation only (a program
    # forgotten while this turn was live, and seen again since, is another)
    program: Optional["ProgramState"] = None


@dataclass(frozen=True, slots=True)
class AdmissionRecord:
    """What happened to one request before it was admitted (the per-request view of bounded
    waiting: which requests were slow and why)."""

    program_id: Optional[str]
    turn: int
    wait_s: float  # from (re-)entering the queue to admission
    overtaken: float  # later arrivals admitted ahead of it, in average prompts prefilled (approximate)
    overtake_budget: int  # the overtakes that made it overdue (fixed when it entered the queue; 0: no bound)
    overdue: bool  # it was overdue when admitted
    held_back: bool  # admission control held it back at least once
    pin_hit: bool  # its program's pin held its prefix
    cached_tokens: Optional[int] = None  # of its prompt, found cached at admission (None: not known)
    return_loss: float = 0.0  # the thrash signal after it (``core/return_loss.py``)
    # a later turn: its program's context when its previous turn ended, and what became of that
    # turn's pin (``programs.PIN_*``): with ``cached_tokens``, what it lost and why
    previous_tokens: Optional[int] = None
    pin_end: Optional[str] = None


@dataclass(slots=True)
class FinishOutcome:
    pin: Optional[Pin] = None
    release: list[Pin] = field(default_factory=list)
    ttl: Optional[float] = None


@dataclass(slots=True)
class StepPlan:
    """What one scheduler step must do, in order: release ``expired`` device pins (offloading
    them when a host tier exists), release ``released`` pins and ``host_expired`` host pins."""

    expired: list[Pin] = field(default_factory=list)
    released: list[Pin] = field(default_factory=list)  # pins of programs forgotten this step
    host_expired: list[Pin] = field(default_factory=list)
