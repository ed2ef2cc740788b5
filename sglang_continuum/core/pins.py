"""The pin table: which program holds a TTL pin on its prefix, until when, and at what cost.

Engine-agnostic: a pin carries an opaque ``handle`` (the engine's lock) that the caller releases
when the table hands the pin back. The table enforces a token budget and answers three questions
in logarithmic time whatever the number of pins: which pins expired (deadline heap), which pin to
shed under pressure (latest program arrival first), and how many tokens are pinned. With scoped
program ids the budget is shared fairly between scopes (``PinTable(scoped=True)``): a pin sheds
another scope's only while that scope holds more than its share.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional


class Tier(str, enum.Enum):
    DEVICE = "device"  # a lock on device KV: the prefix is resident and not evictable
    HOST = "host"  # a host lock (HiCache): the prefix's host copy is protected, device memory is not held


@dataclass(eq=False, slots=True)
class Pin:
    program_id: str
    tokens: int
    deadline: float
    arrival_rank: int  # the program's arrival order (program-FCFS rank): later arrivals are shed first
    created: float
    handle: Any = None
    overstay: bool = False  # deadline already extended once because a turn of the program waited
    tier: Tier = Tier.DEVICE
    scope: Optional[str] = None  # its program's sender (``scopes.py``): the share of the budget it counts in
    seq: int = field(default=0, compare=False)


CHANGE_LOG = 4096


class _ScopeShares:
    """What each scope's pins hold, and each scope's pins latest-ranked first (lazy heaps, as the
    table's): the budget's fair shares between scopes (``PinTable(scoped=True)``)."""

    def __init__(self) -> None:
        self.tokens: dict[Optional[str], int] = {}
        self.count: dict[Optional[str], int] = {}
        self.latest: dict[Optional[str], list[tuple[int, int, Pin]]] = {}  # (-arrival_rank, -seq, pin)
        self._largest: list[tuple[int, int, Optional[str]]] = []  # (-tokens, push order, scope), lazy
        self._pushes = itertools.count()

    def added(self, pin: Pin) -> None:
        scope = pin.scope
        self.tokens[scope] = self.tokens.get(scope, 0) + pin.tokens
        self.count[scope] = self.count.get(scope, 0) + 1
        heapq.heappush(self.latest.setdefault(scope, []), (-pin.arrival_rank, -pin.seq, pin))
        self._push(scope)

    def removed(self, pin: Pin) -> None:
        scope = pin.scope
        self.count[scope] -= 1
        self.tokens[scope] -= pin.tokens
        if self.count[scope] == 0:
            del self.tokens[scope], self.count[scope], self.latest[scope]
        else:
            self._push(scope)

    def largest(self) -> Optional[str]:
        """The scope whose pins hold the most tokens (None: no pins, or the unscoped scope's)."""
        heap = self._largest
        while heap and self.tokens.get(heap[0][2], -1) != -heap[0][0]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _push(self, scope: Optional[str]) -> None:
        heapq.heappush(self._largest, (-self.tokens[scope], next(self._pushes), scope))
        if len(self._largest) > 2 * len(self.tokens) + 64:
            self._largest = [(-t, next(self._pushes), s) for s, t in self.tokens.items()]
            heapq.heapify(self._largest)


class PinTable:
    """Pins keyed by program id; deadline heap and shed heap with lazy deletion."""

    def __init__(self, budget_tokens: int, *, ceiling_tokens: Optional[int] = None, scoped: bool = False) -> None:
        """``budget_tokens``: what pins may hold; ``ceiling_tokens`` (at least the budget): what
        they may hold with the resident pins among them (``add(resident=True)``), whose room the
        door already keeps for their programs. ``scoped``: the budget is shared fairly between the
        pins' scopes (``add``)."""
        if budget_tokens < 0:
            raise ValueError("budget must be >= 0")
        self.budget_tokens = int(budget_tokens)
        self.ceiling_tokens = max(self.budget_tokens, int(ceiling_tokens or 0))
        self._pins: dict[str, Pin] = {}
        self._by_deadline: list[tuple[float, int, Pin]] = []
        self._by_arrival: list[tuple[int, int, Pin]] = []  # (-arrival_rank, -seq, pin)
        self._seq = itertools.count(1)
        self.pinned_tokens = 0
        self.version = 0  # bumps whenever the set of pins changes (lets callers cache derived state)
        # (version, program id or None for "all") of the latest changes: lets a caller that
        # cached per-program state since version v update only the programs that changed
        self._changes: deque[tuple[int, Optional[str]]] = deque(maxlen=CHANGE_LOG)
        self.shares = _ScopeShares() if scoped else None

    # -- queries -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._pins

    def __iter__(self) -> Iterator[Pin]:
        return iter(list(self._pins.values()))

    def get(self, program_id: str) -> Optional[Pin]:
        return self._pins.get(program_id)

    def changed_since(self, version: int) -> Optional[set[str]]:
        """Programs whose pin was added or removed after ``version``; None when that is not
        known any more (the log was outrun, or the table was cleared): assume everything did."""
        changed: set[str] = set()
        if version == self.version:
            return changed
        oldest = self._changes[0][0] if self._changes else self.version + 1
        if version < oldest - 1:
            return None
        for v, program_id in reversed(self._changes):
            if v <= version:
                break
            if program_id is None:
                return None
            changed.add(program_id)
        return changed

    def next_deadline(self) -> Optional[float]:
        self._drop_stale(self._by_deadline, self._deadline_entry_live)
        return self._by_deadline[0][0] if self._by_deadline else None

    def peek_latest(self) -> Optional[Pin]:
        """The pin that would be shed next (latest program arrival)."""
        heap = self._by_arrival
        while heap and self._pins.get(heap[0][2].program_id) is not heap[0][2]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    # -- updates -------------------------------------------------------------------------
    def limit(self, resident: bool = False) -> int:
        """What pins may hold once a pin of this kind is added."""
        return self.ceiling_tokens if resident else self.budget_tokens

    def add(self, pin: Pin, *, resident: bool = False) -> tuple[bool, list[Pin]]:
        """Insert ``pin``; return (stored, pins the caller must release). ``resident``: the door
        keeps the program resident, so the pins may fill the ceiling rather than the budget.

        Released are the program's previous pin (if any) and, when the limit would be exceeded,
        victims taken latest program arrival first among programs that arrived after ``pin``'s
        (``scoped``: see ``_victim``). Whether that can make room is decided before anything is
        shed: a pin that cannot be stored (larger than the budget, or the budget is held by
        earlier programs) is refused and sheds nobody.
        """
        released: list[Pin] = []
        old = self.pop(pin.program_id)
        if old is not None:
            released.append(old)
        limit = self.limit(resident)
        if pin.tokens > limit:
            return False, released
        victims: list[Pin] = []
        while self.pinned_tokens + pin.tokens > limit:
            if self.shares is None:
                latest = self.pop_latest(ranked_after=pin.arrival_rank)
            else:
                latest = self._victim(pin, limit)
            if latest is None:  # the rest of the budget belongs to earlier programs: refuse
                for victim in victims:
                    self._restore(victim)
                return False, released
            victims.append(latest)
        released.extend(victims)
        pin.seq = next(self._seq)
        self._pins[pin.program_id] = pin
        self.pinned_tokens += pin.tokens
        if self.shares is not None:
            self.shares.added(pin)
        self._bump(pin.program_id)
        heapq.heappush(self._by_deadline, (pin.deadline, pin.seq, pin))
        heapq.heappush(self._by_arrival, (-pin.arrival_rank, -pin.seq, pin))
        self._maybe_compact(pin.scope)
        return True, released

    def pop(self, program_id: str) -> Optional[Pin]:
        """Remove and return the program's pin (consume on hit, or release on last step/abort)."""
        pin = self._pins.get(program_id)
        if pin is not None:
            self._remove(pin)
        return pin

    def pop_expired(self, now: float, hold: Callable[[Pin], Optional[float]]) -> list[Pin]:
        """Remove pins whose deadline passed.

        ``hold(pin)`` may return a new deadline to keep an expired pin a while longer (a turn of
        its program is waiting to be admitted); it is asked once per pin, so a held pin always
        expires by the deadline it returns.
        """
        expired: list[Pin] = []
        heap = self._by_deadline
        while heap and heap[0][0] <= now:
            deadline, seq, pin = heapq.heappop(heap)
            if not self._deadline_entry_live((deadline, seq, pin)):
                continue
            if not pin.overstay:
                new_deadline = hold(pin)
                if new_deadline is not None and new_deadline > now:
                    pin.overstay = True
                    pin.deadline = new_deadline
                    heapq.heappush(heap, (new_deadline, pin.seq, pin))
                    continue
            self._remove(pin)
            expired.append(pin)
        return expired

    def pop_latest(
        self,
        *,
        ranked_after: Optional[int] = None,
        keep: Optional[str] = None,
        spare: Optional[Callable[[Pin], bool]] = None,
    ) -> Optional[Pin]:
        """Shed: remove and return the pin of the latest-arriving program -- only if its program
        arrived after rank ``ranked_after`` (when given), is not ``keep`` and is not spared by
        ``spare(pin)`` (e.g. its next turn is already waiting: shedding it throws away a certain
        hit). Stepped-over pins stay in the table; cost O((stepped over + 1) log pins)."""
        heap = self._by_arrival
        stepped: list[tuple[int, int, Pin]] = []
        found: Optional[Pin] = None
        try:
            while True:
                pin = self.peek_latest()
                if pin is None or (ranked_after is not None and pin.arrival_rank <= ranked_after):
                    break
                if pin.program_id == keep or (spare is not None and spare(pin)):
                    stepped.append(heapq.heappop(heap))
                    continue
                found = pin
                break
        finally:
            for entry in stepped:
                heapq.heappush(heap, entry)
        if found is not None:
            self._remove(found)
        return found

    def _victim(self, pin: Pin, limit: int) -> Optional[Pin]:
        """The pin ``pin`` sheds when the budget is shared between scopes, each a fair share
        (``limit`` over the scopes holding pins, ``pin``'s counted): the unscoped rule (latest
        first among programs ranked after it) over its own scope's pins and those of the largest
        scope while that one holds more than its share. So a scope's pins within its share are
        never shed for another's, and with one scope this is the unscoped rule exactly."""
        shares = self.shares
        assert shares is not None
        share = limit / (len(shares.tokens) + (pin.scope not in shares.tokens))
        largest = shares.largest()
        candidates = [pin.scope]
        if largest != pin.scope and largest in shares.tokens and shares.tokens[largest] > share:
            candidates.append(largest)
        heads = [(head.arrival_rank, head.seq, scope) for scope in candidates if (head := self._head(scope))]
        heads = [h for h in heads if h[0] > pin.arrival_rank]
        return self._pop_scope(max(heads)[2]) if heads else None

    def _head(self, scope: Optional[str]) -> Optional[Pin]:
        """The latest-ranked pin of ``scope`` (stale heap entries dropped)."""
        heap = self.shares.latest.get(scope, [])
        while heap and self._pins.get(heap[0][2].program_id) is not heap[0][2]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _pop_scope(self, scope: Optional[str]) -> Pin:
        pin = heapq.heappop(self.shares.latest[scope])[2]
        self._remove(pin)
        return pin

    def clear(self) -> list[Pin]:
        pins = list(self._pins.values())
        if self.shares is not None:
            self.shares = _ScopeShares()
        self._pins.clear()
        self._by_deadline.clear()
        self._by_arrival.clear()
        self.pinned_tokens = 0
        self._bump(None)
        return pins

    # -- integrity -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError if the table's invariants do not hold."""
        assert self.pinned_tokens == sum(p.tokens for p in self._pins.values()), "token sum"
        assert self.pinned_tokens <= self.ceiling_tokens, "ceiling exceeded"
        assert all(p.tokens >= 0 for p in self._pins.values()), "negative pin"
        assert all(pid == p.program_id for pid, p in self._pins.items()), "pin filed under another program"
        live_d = {id(p) for d, s, p in self._by_deadline if self._deadline_entry_live((d, s, p))}
        live_a = {id(p) for _, _, p in self._by_arrival if self._pins.get(p.program_id) is p}
        ids = {id(p) for p in self._pins.values()}
        assert live_d == ids, "deadline heap out of sync"
        assert live_a == ids, "arrival heap out of sync"
        if self.shares is not None:
            tokens: dict[Optional[str], int] = {}
            for p in self._pins.values():
                tokens[p.scope] = tokens.get(p.scope, 0) + p.tokens
            assert self.shares.tokens == tokens, "scope shares out of date"
            live_s = {
                id(p) for heap in self.shares.latest.values() for _, _, p in heap if self._pins.get(p.program_id) is p
            }
            assert live_s == ids, "scope heaps out of sync"

    # -- internals -----------------------------------------------------------------------
    def _remove(self, pin: Pin) -> None:
        del self._pins[pin.program_id]
        self.pinned_tokens -= pin.tokens
        if self.shares is not None:
            self.shares.removed(pin)
        self._bump(pin.program_id)

    def _restore(self, pin: Pin) -> None:
        """Undo ``_remove`` of a tentative victim (its deadline entry is still in the heap)."""
        self._pins[pin.program_id] = pin
        self.pinned_tokens += pin.tokens
        if self.shares is not None:
            self.shares.added(pin)
        self._bump(pin.program_id)
        heapq.heappush(self._by_arrival, (-pin.arrival_rank, -pin.seq, pin))

    def _bump(self, program_id: Optional[str]) -> None:
        self.version += 1
        self._changes.append((self.version, program_id))

    def _deadline_entry_live(self, entry: tuple[float, int, Pin]) -> bool:
        deadline, seq, pin = entry
        return self._pins.get(pin.program_id) is pin and pin.deadline == deadline

    @staticmethod
    def _drop_stale(heap: list, live: Callable) -> None:
        while heap and not live(heap[0]):
            heapq.heappop(heap)

    def _maybe_compact(self, scope: Optional[str] = None) -> None:
        # Lazy deletion leaves dead entries behind; rebuild when they outnumber the live ones so
        # memory stays O(pins) and each operation stays O(log pins) amortised.
        limit = 2 * len(self._pins) + 64
        if len(self._by_deadline) > limit:
            self._by_deadline = [(p.deadline, p.seq, p) for p in self._pins.values()]
            heapq.heapify(self._by_deadline)
        if len(self._by_arrival) > limit:
            self._by_arrival = [(-p.arrival_rank, -p.seq, p) for p in self._pins.values()]
            heapq.heapify(self._by_arrival)
        shares = self.shares
        if shares is not None and len(heap := shares.latest.get(scope, ())) > 2 * shares.count.get(scope, 0) + 64:
            shares.latest[scope] = [e for e in heap if self._pins.get(e[2].program_id) is e[2]]
            heapq.heapify(shares.latest[scope])


SURVIVAL_WINDOW = 256  # pin outcomes (hit, or shed and its program came back) the survival reads


class PinSurvival:
    """The share of pins whose program came back to them (a hit) rather than after they were shed,
    over the latest ``window`` such outcomes, Laplace-smoothed: the cost model scales a pin's hit
    probability by it (a pin that is likely shed is worth less). A window, so that a new pressure
    regime moves it within minutes, not hours."""

    def __init__(self, window: int = SURVIVAL_WINDOW) -> None:
        self._outcomes: deque[bool] = deque(maxlen=window)  # True: a hit
        self._hits = 0  # of them

    def outcome(self, *, hit: bool) -> float:
        """Record one outcome; returns the survival now."""
        window = self._outcomes
        if len(window) == window.maxlen:
            self._hits -= window[0]
        window.append(hit)
        self._hits += hit
        return (self._hits + 1.0) / (len(window) + 1.0)

    def check_integrity(self) -> None:
        assert self._hits == sum(self._outcomes), "pin survival window"
