"""Tool-call statistics: bounded sliding windows of durations per tool and globally, and per
tool whether programs came back from it at all.

Each duration window keeps its samples both in arrival order (to drop the oldest) and sorted (so
an empirical CDF, a quantile or the TTL argmax over candidates is one vectorised pass, with no
sort per decision). The sorted copy is one array (grown by doubling up to the window), kept sorted
in place: a new sample replacing the oldest moves only the samples between the two places (a third
of the window on average), with no allocation and no copy of the rest.

Bounded whatever they are fed (a peer, a stats file, a client's tool name): at most ``max_tools``
tools, least recently used first out; a sample ``valid_sample`` refuses (a duration that is not a
number in [0, ``MAX_DURATION_S``], an outcome other than 0 or 1, a name a client could not send)
is counted in ``refused`` and left out, so no sum goes infinite or NaN.

Durations are only ever observed for programs that came back. A tool after which programs often
end (a submit the server did not recognise, an agent that gives up) would look like any other,
so each tool also keeps its last ``return_window`` outcomes -- came back, or the program ended
while out on it -- and ``return_probability`` scales the CDF: ``P(tau, f) = rho_f * F_f(tau)``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any, Iterable, Optional

import numpy as np

from sglang_continuum.core.metadata import MAX_TOOL_NAME_LEN
from sglang_continuum.core.programs import PROGRAM_IDLE_TIMEOUT_S

UNKNOWN_TOOL = "unknown"
DURATION = "d"  # a tool call's duration in seconds
OUTCOME = "r"  # a program came back from the tool (1.0) or ended while out on it (0.0)
KINDS = (DURATION, OUTCOME)
Sample = tuple[str, str, float]  # (kind, tool, value): what workers share (``stats_exchange``)
# No worker observes a longer tool call: a program away for PROGRAM_IDLE_TIMEOUT_S is forgotten,
# and its next turn starts a new program. Twice that leaves room for a forget that runs late.
MAX_DURATION_S = 2 * PROGRAM_IDLE_TIMEOUT_S


def valid_tool(tool: Any) -> bool:
    """A tool name as ``metadata`` takes one from a client: a printable string, not blank, at most
    ``MAX_TOOL_NAME_LEN`` long."""
    return isinstance(tool, str) and 0 < len(tool) <= MAX_TOOL_NAME_LEN and tool.isprintable() and not tool.isspace()


def valid_value(kind: Any, value: Any) -> bool:
    """A duration in [0, ``MAX_DURATION_S``] seconds, or an outcome of 0 or 1 (NaN and inf fail)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or kind not in KINDS:
        return False
    return 0 <= value <= MAX_DURATION_S if kind == DURATION else value in (0, 1)


def valid_sample(kind: Any, tool: Any, value: Any) -> bool:
    return valid_value(kind, value) and valid_tool(tool)


class SampleWindow:
    """The last ``capacity`` samples, in arrival order and sorted; running mean and variance.
    Holds finite non-negative numbers (``add`` and ``extend`` raise on anything else)."""

    __slots__ = ("capacity", "_fifo", "_buf", "_sum", "_sumsq", "version")

    def __init__(self, capacity: int, samples: Iterable[float] = ()) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._fifo: deque[float] = deque()
        self._buf = np.empty(0, dtype=np.float64)  # the samples sorted in [:len], grown by doubling
        self._sum = 0.0
        self._sumsq = 0.0
        self.version = 0  # bumps on every change; lets callers cache derived values
        self.extend(samples)

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, x: float) -> None:
        """O(log n) to find both places, then a move of the samples between them, in place."""
        x = float(x)
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"sample must be a finite non-negative number, got {x}")
        n, b = len(self._fifo), self._buf
        if n == self.capacity:  # x takes the oldest sample's place in the sorted array
            old = self._fifo.popleft()
            i, k = int(b.searchsorted(old)), int(b.searchsorted(x, "right"))  # b is the window: n == b.size
            if k > i:  # x sorts above old: the samples between move down one
                b[i : k - 1] = b[i + 1 : k]
                b[k - 1] = x
            else:
                b[k + 1 : i + 1] = b[k:i]
                b[k] = x
            self._sum -= old
            self._sumsq -= old * old
        else:
            if b.size == n:
                b = self._buf = np.concatenate([b, np.empty(min(self.capacity, max(16, 2 * n)) - n)])
            k = int(np.searchsorted(b[:n], x, "right"))
            b[k + 1 : n + 1] = b[k:n]
            b[k] = x
        self._fifo.append(x)
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
        if not all(math.isfinite(x) and x >= 0 for x in new):
            raise ValueError("samples must be finite non-negative numbers")
        new = new[-self.capacity :]  # older ones would be pushed out by the newer at once
        ordered = self._buf[: len(self._fifo)]
        overflow = len(self._fifo) + len(new) - self.capacity
        if overflow > 0:
            old = np.sort(np.array([self._fifo.popleft() for _ in range(overflow)]))
            first = np.searchsorted(ordered, old, "left")
            # equal old values occupy consecutive slots: the k-th copy is k places after the first
            nth = np.arange(old.size) - np.searchsorted(old, old, "left")
            ordered = np.delete(ordered, first + nth)
            self._sum -= float(old.sum())
            self._sumsq -= float((old * old).sum())
        add = np.sort(np.array(new))
        self._buf = np.insert(ordered, np.searchsorted(ordered, add, "right"), add)
        self._fifo.extend(new)
        self._sum += float(add.sum())
        self._sumsq += float((add * add).sum())
        self.version += 1

    @property
    def sorted(self) -> np.ndarray:
        """Samples in ascending order: a read-only view of the live window (read it, do not keep
        it across an ``add``)."""
        view = self._buf[: len(self._fifo)]
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
        n, ordered = len(self._fifo), self.sorted
        assert n <= self.capacity and ordered.size == n <= self._buf.size <= self.capacity, "window size"
        assert n == 0 or bool(np.all(np.diff(ordered) >= 0)), "window not sorted"
        assert sorted(self._fifo) == ordered.tolist(), "sorted view differs from the samples"
        assert math.isfinite(self._sum) and math.isfinite(self._sumsq), "running sums"
        assert abs(self._sum - sum(self._fifo)) <= 1e-6 * max(1.0, abs(self._sum)), "running sum"

    def cdf(self, tau: float) -> float:
        n = len(self._fifo)
        return float(np.searchsorted(self.sorted, tau, "right")) / n if n else 0.0


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
        self.refused = 0  # samples left out: ``valid_sample`` refused them (a peer's, a file's, a local one)

    def record(self, tool: Optional[str], seconds: float) -> None:
        if not valid_sample(DURATION, tool or UNKNOWN_TOOL, seconds):
            self.refused += 1
            return
        self._window(tool).add(seconds)
        self.global_samples.add(seconds)

    def record_many(self, tool: Optional[str], seconds: list[float]) -> None:
        """``record`` for a batch of one tool's samples (in order), in one pass per window."""
        seconds = self._valid(tool or UNKNOWN_TOOL, seconds)
        if seconds:
            self._window(tool).extend(seconds)
            self.global_samples.extend(seconds)

    def _valid(self, tool: str, seconds: list) -> list:
        """The durations ``valid_sample`` accepts for ``tool`` (the rest counted in ``refused``)."""
        valid = [x for x in seconds if valid_value(DURATION, x)] if valid_tool(tool) else []
        self.refused += len(seconds) - len(valid)
        return valid

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
        elif valid_sample(kind, tool or UNKNOWN_TOOL, value):
            self.record_outcome(tool, returned=value > 0)
        else:
            self.refused += 1

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
        assert all(map(valid_tool, (*self._tools, *self._outcomes))), "a tool name valid_tool refuses"
        for window in (self.global_samples, *self._tools.values()):
            window.check_integrity()
            assert len(window) == 0 or window.sorted[-1] <= MAX_DURATION_S, "a duration over MAX_DURATION_S"

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
        """What ``to_dict`` wrote, through the bounds live samples meet: a name or value
        ``valid_sample`` refuses is left out (counted in ``refused``), and of more than
        ``max_tools`` tools the last ones are kept (``to_dict`` lists the least recently used first)."""
        if data.get("version") != 1:
            raise ValueError(f"unsupported tool-stats version: {data.get('version')!r}")
        for name, samples in list(data.get("tools", {}).items())[-self.max_tools :]:
            if samples := self._valid(name, samples):
                self._window(name).extend(samples)
        self.global_samples.extend(self._valid(UNKNOWN_TOOL, data.get("global", [])))
        for name, outcomes in list(data.get("returns", {}).items())[-self.max_tools :]:
            for returned in outcomes:
                self.record_sample(OUTCOME, name, returned)
