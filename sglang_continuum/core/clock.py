"""The one clock that time-dependent policy reads.

Policy objects take a ``Clock`` (a zero-argument callable returning seconds) instead of calling
``time`` directly, so tests and the emulator can drive time by hand.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

Clock = Callable[[], float]


def monotonic_clock() -> float:
    return time.monotonic()


_default: list[Clock] = [monotonic_clock]


def default_clock() -> Clock:
    """The clock engine-built objects use when none is passed (SGLang builds the cache itself)."""
    return _default[-1]


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Objects built inside this block read ``clock`` (tests and the emulator drive a real
    SGLang scheduler on a manual or virtual clock this way)."""
    _default.append(clock)
    try:
        yield clock
    finally:
        _default.pop()


class ManualClock:
    """A clock that moves only when told to (tests, emulation)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.now += seconds
        return self.now


class StepClock:
    """A clock frozen for the length of one scheduler step.

    The scheduler sets it once per iteration (``set``) from a value every tensor-parallel rank
    agrees on; every decision taken during that step reads the same ``now``. That is what keeps
    ranks' pin decisions identical without a collective per decision. ``set`` never moves time
    backwards.
    """

    def __init__(self, source: Clock = monotonic_clock) -> None:
        self._source = source
        self._now = source()

    def __call__(self) -> float:
        return self._now

    def read_source(self) -> float:
        return self._source()

    def set(self, now: float) -> float:
        if now > self._now:
            self._now = now
        return self._now
