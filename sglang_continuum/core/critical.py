"""Critical agents of multi-agent applications: a reserved share of the pool for the programs on
their application's critical path (Tokencake's space scheduler, its section 5), so that a
non-critical agent cannot evict a critical one ("critical inversion").

A client marks a program critical (``metadata.CRITICAL_KEY``, with ``APP_ID_KEY`` naming its
application). The reserve is a share of the admission capacity that follows memory pressure as
Tokencake's Algorithm 2 does: up by ``step`` while the working set fills more than ``high`` of the
capacity, down while it fills less than ``low``, between 0 and ``max_ratio``; with no critical
program in flight it is 0. What critical programs do not use of it is withheld from the rest, in two
decisions:

* the door (``door.py``): a non-critical program's first turn sees the capacity less the unused
  reserve;
* shedding (``shedding.py``): a pin of a critical program is spared for a non-critical turn while the
  critical programs' pins fit in the reserve.

Tokencake also splits the reserve among critical agent types by memory use and priority; here every
critical program shares one reserve. Without critical programs nothing here acts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from sglang_continuum.core.programs import ProgramRegistry, ProgramState

if TYPE_CHECKING:
    from sglang_continuum.core.door import WorkingSet
    from sglang_continuum.core.pins import PinTable
    from sglang_continuum.core.shedding import Spare

RESERVE_HIGH_USAGE = 0.9  # the working set fills more of the capacity than this: the reserve grows
RESERVE_LOW_USAGE = 0.5  # ... less than this: it shrinks
RESERVE_STEP = 0.02  # per adjustment, a share of the capacity
RESERVE_MAX_RATIO = 0.3
RESERVE_INTERVAL_S = 0.5  # how often the reserve moves (Tokencake: periodically)
MAX_CRITICAL_PROGRAMS = 4096  # tracked at once; past it a new critical program is served as any


class CriticalShare:
    def __init__(
        self,
        programs: ProgramRegistry,
        working_set: "WorkingSet",
        *,
        high: float = RESERVE_HIGH_USAGE,
        low: float = RESERVE_LOW_USAGE,
        step: float = RESERVE_STEP,
        max_ratio: float = RESERVE_MAX_RATIO,
        interval_s: float = RESERVE_INTERVAL_S,
    ) -> None:
        if not 0.0 <= low < high <= 1.0 or not 0.0 < step <= max_ratio <= 1.0:
            raise ValueError("critical share: need 0 <= low < high <= 1 and 0 < step <= max_ratio <= 1")
        self.programs = programs
        self.working_set = working_set
        self.high, self.low, self.step_ratio, self.max_ratio, self.interval_s = high, low, step, max_ratio, interval_s
        self.ratio = 0.0
        self.reserve_tokens = 0
        self.critical_tokens = 0  # what critical programs in the working set reserve
        self._critical: dict[str, ProgramState] = {}
        self._next_adjust = 0.0

    def __len__(self) -> int:
        return len(self._critical)

    def arrived(self, state: ProgramState, app_id: Optional[str], critical: bool) -> None:
        """A turn of ``state`` arrived with these hints (its latest turn's flag is the program's)."""
        if app_id is not None:
            state.app_id = app_id
        state.critical = critical and (state.program_id in self._critical or len(self) < MAX_CRITICAL_PROGRAMS)
        if state.critical:
            self._critical[state.program_id] = state
        else:
            self._critical.pop(state.program_id, None)

    def is_critical(self, program_id: Optional[str]) -> bool:
        return program_id is not None and program_id in self._critical

    def step(self, now: float, capacity_tokens: int) -> None:
        """Once per scheduler step: forget ended programs, count what the critical ones reserve,
        and move the reserve with the pressure (every ``interval_s``)."""
        for pid, state in list(self._critical.items()) if self._critical else ():
            if self.programs.get(pid) is not state:
                del self._critical[pid]
        working, floor = self.working_set, self.working_set.floor
        self.critical_tokens = sum(max(s.context_tokens, floor) for pid, s in self._critical.items() if pid in working)
        if not self._critical or capacity_tokens <= 0:
            self.ratio, self.reserve_tokens = 0.0, 0
            return
        if now >= self._next_adjust:
            self._next_adjust = now + self.interval_s
            usage = working.reserved_tokens() / capacity_tokens
            if usage >= self.high:
                self.ratio = min(self.max_ratio, self.ratio + self.step_ratio)
            elif usage <= self.low:
                self.ratio = max(0.0, self.ratio - self.step_ratio)
        self.reserve_tokens = int(self.ratio * capacity_tokens)

    def withheld(self, state: Optional[ProgramState]) -> int:
        """What of the capacity a turn of ``state`` may not use: the reserve critical programs do not
        use, for a non-critical program; nothing for a critical one."""
        if state is not None and state.program_id in self._critical:
            return 0
        return max(0, self.reserve_tokens - self.critical_tokens)

    def spares(self, blocked: Optional[str], spares: Sequence["Spare"], pins: "PinTable") -> Sequence["Spare"]:
        """Shedding's sparing rules for a turn of program ``blocked``: a non-critical turn first tries
        them with the critical programs' pins spared too, while those pins fit in the reserve."""
        if self.reserve_tokens <= 0 or self.is_critical(blocked):
            return spares
        held = sum(pin.tokens for pin in pins if pin.program_id in self._critical)
        if held <= 0 or held > self.reserve_tokens:
            return spares

        def with_critical(spare: "Spare") -> "Spare":
            return lambda pid: pid in self._critical or (spare is not None and spare(pid))

        return (*map(with_critical, spares), *spares)

    def snapshot(self) -> dict:
        return {
            "programs": len(self),
            "ratio": self.ratio,
            "reserve": self.reserve_tokens,
            "used": self.critical_tokens,
        }

    def check_integrity(self) -> None:
        assert len(self._critical) <= MAX_CRITICAL_PROGRAMS, "critical programs past their bound"
        assert 0.0 <= self.ratio <= self.max_ratio, "reserve ratio out of bounds"
        assert all(s.critical for s in self._critical.values()), "a tracked program not marked critical"
