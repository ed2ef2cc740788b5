"""Which pin gives its memory back when memory is needed (work-conserving shedding).

A pin never keeps a higher-ranked turn out and never wedges admission, so when a turn is blocked,
an allocation cannot be served, or the engine would idle, pins are shed one at a time in this
order:
1. a stale pin, whatever its rank: its program, whose client announces no ends, stayed away past
   its own pace (``silence.py``), so it gives the memory up first;
2. else the latest-arriving program's pin (program-level FCFS: the pin worth least to the order),
   only one of a program ranked after the blocked turn's when one is given.
Never the blocked turn's own program's pin (``keep``). ``spares`` are sparing rules tried in turn,
each a weaker fallback of the one before (e.g. first spare programs with a turn waiting, whose pin
is a certain hit, then only those a turn of this selection took, whose pin frees nothing its own
lock does not hold; None: spare nothing).

Pure: the adapter releases the chosen pin's lock; the controller counts it.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from sglang_continuum.core.pins import Pin, PinTable
from sglang_continuum.core.programs import ProgramRegistry
from sglang_continuum.core.silence import Silence

Spare = Optional[Callable[[str], bool]]  # program id -> whether its pin is spared


class Shedding:
    def __init__(self, pins: PinTable, programs: ProgramRegistry, silence: Silence) -> None:
        self.pins = pins
        self.programs = programs
        self.silence = silence

    def victim(
        self,
        now: float,
        *,
        ranked_after: Optional[int] = None,
        keep: Optional[str] = None,
        spares: Sequence[Spare] = (None,),
    ) -> Optional[tuple[Pin, bool]]:
        """The pin to shed, popped from the table, and whether it was stale; None if none."""
        for spare in spares:
            by_pin = None if spare is None else (lambda pin, spare=spare: spare(pin.program_id))
            pin = self.silence.stale_pin(now, self.pins, self.programs, keep=keep, spare=by_pin)
            if pin is not None:
                return pin, True
            pin = self.pins.pop_latest(ranked_after=ranked_after, keep=keep, spare=by_pin)
            if pin is not None:
                return pin, False
        return None

    def stale(self, now: float, keep: str) -> Optional[Pin]:
        """A stale pin (not ``keep``'s), popped: what a new pin pushes out of the budget first."""
        return self.silence.stale_pin(now, self.pins, self.programs, keep=keep)
