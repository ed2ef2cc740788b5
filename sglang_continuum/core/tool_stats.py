"""Tool-call statistics: bounded sliding windows of durations per tool and globally, and per
tool whether programs came back from it at all.

Each duration window keeps its samples both in arrival order (to drop the oldest) and sorted (so
an empirical CDF, a quantile or the TTL argmax over candidates is one vectorised pass, with no
sort per decision).

Durations are only ever observed for programs that came back. A tool after which programs often
end (a submit the server did not recognise, an agent that gives up) would look like any other,
so each tool also keeps its last ``return_window`` outcomes -- came back, or the program ended
while out on it -- and ``return_probability`` scales the CDF: ``P(tau, f) = rho_f * F_f(tau)``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterable, Optional

import numpy as np

from sglang_continuum.core.stats_exchange import DURATION, Sample

UNKNOWN_TOOL = "unknown"


class SampleWindow:
    """The last ``capacity`` samples, in arrival order and sorted; running mean and variance."""

    __slots__ = ("capacity", "_fifo", "_sorted", "_n", "_sum", "_sumsq", "version")

    def __init__(self, capacity: int, samples: Iterable[float] = ()) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._fifo: deque[float] = deque()
        self._sorted = np.empty(0, dtype=np.float64)
        self._sum = 0.0
        self._sumsq = 0.0
        self.version = 0  # bumps on every change; lets callers cache derived values
        self.extend(samples)

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, x: float) -> None:
        x = float(x)
        if not np.isfinite(x) or x < 0:
            raise ValueError(f"sample must be a finite non-negative number, got {x}")
        if len(self._fifo) == self.capacity:
            old = self._fifo.popleft()
            i = int(np.searchsorted(self._sorted, old))
            self._sorted = np.delete(self._sorted, i)
            self._sum -= old
            self._sumsq -= old * old
        self._fifo.append(x)
        self._sorted = np.insert(self._sorted, int(np.searchsorted(self._sorted, x, "right")), x)
        self._sum += x
        self._sumsq += x * x
        self.version += 1

    def extend(self, xs: Iterable[float]) -> None:
        """Add many samples in one pass over the sorted array (peers' samples arrive in batches):
        the same result as ``add`` for each in order, at the cost of about one ``add``."""
        new = [float(x) for x in xs]
        if len(new) <= 1:
            for x in new:
                self.add(x)
            return
        if not all(np.isfinite(x) and x >= 0 for x in new):
            raise ValueError("samples must be finite non-negative numbers")
        new = new[-self.capacity :]  # older ones would be pushed out by the newer at once
        overflow = len(self._fifo) + len(new) - self.capacity
        if overflow > 0:
            old = np.sort(np.array([self._fifo.popleft() for _ in range(overflow)]))
            first = np.searchsorted(self._sorted, old, "left")
            # equal old values occupy consecutive slots: the k-th copy is k places after the first
            nth = np.arange(old.size) - np.searchsorted(old, old, "left")
            self._sorted = np.delete(self._sorted, first + nth)
            self._sum -= float(old.sum())
            self._sumsq -= float((old * old).sum())
        add = np.sort(np.array(new))
        self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, add, "right"), add)
        self._fifo.extend(new)
        self._sum += float(add.sum())
        self._sumsq += float((add * add).sum())
        self.version += 1

    @property
    def sorted(self) -> np.ndarray:
        """Samples in ascending order (read-only view)."""
        view = self._sorted.view()
        view.flags.writeable = False
        return view

    def samples(self) -> list[float]:
        return list(self._fifo)

    @property
    def mean(self) -> float:
        return self._sum / len(self._fifo) if self._fifo else float("nan")

    @property
    def variance(self) -> float:
        n = len(self._fifo)
        if n < 2:
            return 0.0
        return max(0.0, (self._sumsq - self._sum * self._sum / n) / (n - 1))

    def check_integrity(self) -> None:
        n = len(self._fifo)
        assert n <= self.capacity and self._sorted.size == n, "window size"
        assert n == 0 or bool(np.all(np.diff(self._sorted) >= 0)), "window not sorted"
        assert sorted(self._fifo) == self._sorted.tolist(), "sorted view differs from the samples"
        assert abs(self._sum - sum(self._fifo)) <= 1e-6 * max(1.0, abs(self._sum)), "running sum"

    def cdf(self, tau: float) -> float:
        n = len(self._fifo)
        return float(np.searchsorted(self._sorted, tau, "right")) / n if n else 0.0


class ToolStats:
    """Per-tool and global windows of tool durations (seconds). Bounded in tools and samples."""

    def __init__(
        self, *, window: int = 10_000, global_window: int = 100_000, max_tools: int = 1024, return_window: int = 200
    ) -> None:
        self.window = window
        self.max_tools = max_tools
        self.return_window = return_window
        self.global_samples = SampleWindow(global_window)
        self._tools: OrderedDict[str, SampleWindow] = OrderedDict()
        self._outcomes: OrderedDict[str, deque[bool]] = OrderedDict()  # True: came back

    def record(self, tool: Optional[str], seconds: float) -> None:
        self._window(tool).add(seconds)
        self.global_samples.add(seconds)

    def record_many(self, tool: Optional[str], seconds: list[float]) -> None:
        """``record`` for a batch of one tool's samples (in order), in one pass per window."""
        if seconds:
            self._window(tool).extend(seconds)
            self.global_samples.extend(seconds)

    def _window(self, tool: Optional[str]) -> SampleWindow:
        """The tool's window, made if new (the least recently used tool leaves past ``max_tools``)."""
        tool = tool or UNKNOWN_TOOL
        w = self._tools.get(tool)
        if w is None:
            w = self._tools[tool] = SampleWindow(self.window)
            while len(self._tools) > self.max_tools:
                self._tools.popitem(last=False)
        else:
            self._tools.move_to_end(tool)
        return w

    def record_sample(self, kind: str, tool: str, value: float) -> None:
        """One sample of the kinds workers share (``stats_exchange``): a duration, or an outcome."""
        if kind == DURATION:
            self.record(tool, value)
        else:
            self.record_outcome(tool, returned=value > 0)

    def merge(self, samples: Iterable[Sample]) -> None:
        """Samples other workers recorded, into the same windows as this worker's own (one pass
        over each sorted window per batch)."""
        durations: dict[str, list[float]] = {}
        for kind, tool, value in samples:
            if kind == DURATION:
                durations.setdefault(tool, []).append(value)
            else:
                self.record_sample(kind, tool, value)
        for tool, seconds in durations.items():
            self.record_many(tool, seconds)

    def record_outcome(self, tool: Optional[str], returned: bool) -> None:
        """A program that called ``tool`` came back (True) or ended while out on it (False)."""
        tool = tool or UNKNOWN_TOOL
        outcomes = self._outcomes.get(tool)
        if outcomes is None:
            outcomes = self._outcomes[tool] = deque(maxlen=self.return_window)
            while len(self._outcomes) > self.max_tools:
                self._outcomes.popitem(last=False)
        else:
            self._outcomes.move_to_end(tool)
        outcomes.append(bool(returned))

    def return_probability(self, tool: Optional[str]) -> float:
        """``(returns + 1) / (outcomes + 1)``: 1 for a tool never seen to strand a program, and
        falling towards the observed rate as programs end while out on it."""
        outcomes = self._outcomes.get(tool or UNKNOWN_TOOL)
        if not outcomes:
            return 1.0
        return (sum(outcomes) + 1.0) / (len(outcomes) + 1.0)

    def tool(self, tool: Optional[str]) -> Optional[SampleWindow]:
        return self._tools.get(tool or UNKNOWN_TOOL)

    def window_for(self, tool: Optional[str], *, min_samples: int) -> tuple[SampleWindow, str]:
        """The tool's own window once it holds ``min_samples``, else the global one (with its name:
        "tool" or "global")."""
        w = self.tool(tool)
        if w is not None and len(w) >= min_samples:
            return w, "tool"
        return self.global_samples, "global"

    def check_integrity(self) -> None:
        assert len(self._tools) <= self.max_tools, "too many tool classes"
        assert len(self._outcomes) <= self.max_tools, "too many tool classes with outcomes"
        assert all(len(o) <= self.return_window for o in self._outcomes.values()), "outcome window"
        self.global_samples.check_integrity()
        for window in self._tools.values():
            window.check_integrity()

    def tools(self) -> dict[str, SampleWindow]:
        return dict(self._tools)

    def to_dict(self) -> dict:
        return {
            "version": 1,
            "window": self.window,
            "tools": {name: w.samples() for name, w in self._tools.items()},
            "global": self.global_samples.samples(),
            "returns": {name: [int(x) for x in o] for name, o in self._outcomes.items()},
        }

    def load_dict(self, data: dict) -> None:
        if data.get("version") != 1:
            raise ValueError(f"unsupported tool-stats version: {data.get('version')!r}")
        for name, samples in data.get("tools", {}).items():
            w = self._tools.setdefault(str(name), SampleWindow(self.window))
            w.extend(samples)
        self.global_samples.extend(data.get("global", []))
        for name, outcomes in data.get("returns", {}).items():
            for returned in outcomes:
                self.record_outcome(str(name), bool(returned))
