"""Tool statistics shared between workers over zmq PUB/SUB, so every worker's TTL model sees the
fleet's tool-time distribution and a worker that starts later is warm within a second.

Each worker binds one PUB socket (``stats_publish_endpoint``) and connects one SUB socket to its
peers (``stats_peer_endpoints``; the list may name the worker's own endpoint: its own messages
are ignored, so every worker can be given the same list). At most every ``interval_s`` a worker
publishes the samples it recorded since its last message (at least a heartbeat every
``HEARTBEAT_S``) and merges what its peers sent. When it hears a peer it has not heard before, it
publishes its recent history once, which is how a late or restarted worker gets warm.

Loss-tolerant by construction: sends and receives are non-blocking and bounded per call, PUB drops
for a subscriber whose queue is full, and nothing ever waits on a peer, so a slow or dead peer
costs nothing but its samples. Merging is bounded too: each poll hands out at most
``max_merge_per_poll`` samples, so a newcomer's burst of histories spreads over several steps. Every sample carries ``(origin, seq)``; per origin the receiver
keeps the interval of sequence numbers it has merged and takes only samples outside it, so a
sample repeated by history messages is merged at most once (a gap left by a dropped message stays
a gap).

Nothing here knows SGLang: the controller hands samples in (``record``) and merges what ``poll``
returns; the adapter calls ``poll`` from the scheduler's step and idle loop.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Optional, Sequence

import orjson

logger = logging.getLogger(__name__)

DURATION = "d"  # a tool call's duration in seconds
OUTCOME = "r"  # a program came back from the tool (1.0) or ended while out on it (0.0)
KINDS = (DURATION, OUTCOME)
HEARTBEAT_S = 0.5  # a quiet worker still announces itself this often (peers detect newcomers)
ALIVE_S = 5.0  # a peer heard within this long counts as alive
MAX_TOOL_LEN = 128
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")

Sample = tuple[str, str, float]  # (kind, tool, value)


@dataclass(slots=True)
class ExchangeCounters:
    sent: int = 0  # samples published (history re-sends not counted again)
    received: int = 0  # peers' new samples taken in (handed to the controller by poll)
    dropped: int = 0  # samples lost here: the outbox (local) or the inbox (peers') was full
    malformed: int = 0  # messages or samples that could not be read (ignored)


@dataclass(slots=True)
class _Peer:
    lo: Optional[int] = None  # merged sequence numbers span [lo, hi]
    hi: Optional[int] = None
    heard: float = -math.inf

    def take(self, seq: int) -> bool:
        """Whether ``seq`` is new (outside the merged interval); widens the interval."""
        if self.lo is not None and self.lo <= seq <= self.hi:
            return False
        self.lo = seq if self.lo is None else min(self.lo, seq)
        self.hi = seq if self.hi is None else max(self.hi, seq)
        return True


class StatsExchange:
    def __init__(
        self,
        publish_endpoint: Optional[str],
        peer_endpoints: Sequence[str] = (),
        *,
        interval_s: float = 0.1,
        history: int = 1024,
        max_outbox: int = 4096,
        max_messages_per_poll: int = 64,
        max_merge_per_poll: int = 64,
        max_inbox: int = 16_384,
        queue_messages: int = 256,
        max_peers: int = 256,
        origin: Optional[str] = None,
    ) -> None:
        import zmq

        for endpoint in (publish_endpoint, *peer_endpoints):
            if endpoint is not None and not endpoint.startswith(ENDPOINT_SCHEMES):
                raise ValueError(f"stats endpoint {endpoint!r} must start with one of {ENDPOINT_SCHEMES}")
        self._zmq = zmq
        self.origin = origin or uuid.uuid4().hex[:16]
        self.interval_s = interval_s
        self.max_outbox = max_outbox
        self.max_messages_per_poll = max_messages_per_poll
        self.max_merge_per_poll = max_merge_per_poll
        self.max_inbox = max_inbox
        self.max_peers = max_peers
        self.counters = ExchangeCounters()
        self._context = zmq.Context()
        self._pub = self._sub = None
        try:
            if publish_endpoint:
                self._pub = self._socket(zmq.PUB, queue_messages)
                self._pub.bind(publish_endpoint)
            if peer_endpoints:
                self._sub = self._socket(zmq.SUB, queue_messages)
                self._sub.setsockopt(zmq.SUBSCRIBE, b"")
                for endpoint in peer_endpoints:
                    self._sub.connect(endpoint)  # zmq connects (and reconnects) in the background
        except zmq.ZMQError:
            self.close()
            raise
        self._seq = 0
        self._outbox: deque[tuple[int, str, str, float]] = deque()  # not yet published
        self._history: deque[tuple[int, str, str, float]] = deque(maxlen=history)  # what a newcomer gets
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self._inbox: deque[Sample] = deque()  # received, not yet handed out (merging is bounded per poll)
        self._send_history = False
        self._next_poll = -math.inf
        self._next_heartbeat = -math.inf

    def _socket(self, kind: int, queue_messages: int):
        zmq = self._zmq
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)  # closing never waits for a peer
        sock.setsockopt(zmq.SNDHWM if kind == zmq.PUB else zmq.RCVHWM, queue_messages)
        return sock

    # -- the controller's side -------------------------------------------------------------
    def record(self, kind: str, tool: str, value: float) -> None:
        """A sample recorded here; published at the next ``poll``. Never blocks."""
        if self._pub is None:
            return
        if len(self._outbox) >= self.max_outbox:
            self.counters.dropped += 1
            return
        self._seq += 1
        sample = (self._seq, kind, tool, float(value))
        self._outbox.append(sample)
        self._history.append(sample)

    def poll(self, now: float) -> list[Sample]:
        """At most every ``interval_s``: publish what is new here and take in the peers' messages.
        Returns at most ``max_merge_per_poll`` of the peers' new samples, so a burst (a peer's
        history) is merged over several steps. Non-blocking; between intervals, with nothing
        left to hand out, the cost is two comparisons."""
        if now >= self._next_poll:
            self._next_poll = now + self.interval_s
            self._receive(now)  # first: a newcomer heard now gets our history at once
            self._publish(now)
        if not self._inbox:
            return []
        inbox = self._inbox
        return [inbox.popleft() for _ in range(min(len(inbox), self.max_merge_per_poll))]

    def peers_alive(self, now: float) -> int:
        return sum(1 for p in self._peers.values() if now - p.heard <= ALIVE_S)

    def close(self) -> None:
        for sock in (self._pub, self._sub):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._sub = None
        self._context.term()

    def check_integrity(self) -> None:
        assert len(self._outbox) <= self.max_outbox, "stats outbox over its bound"
        assert len(self._inbox) <= self.max_inbox, "stats inbox over its bound"
        assert len(self._peers) <= self.max_peers, "too many stats peers"
        seqs = [s[0] for s in self._history]
        assert seqs == sorted(set(seqs)), "stats history out of order"
        for peer in self._peers.values():
            assert (peer.lo is None) == (peer.hi is None) and (peer.lo is None or peer.lo <= peer.hi), "peer interval"

    # -- internals -------------------------------------------------------------------------
    def _publish(self, now: float) -> None:
        if self._pub is None:
            return
        if self._send_history:
            samples = list(self._history)
            self._send_history = False
        elif self._outbox or now >= self._next_heartbeat:
            samples = list(self._outbox)
        else:
            return
        self.counters.sent += len(self._outbox)
        self._outbox.clear()
        self._next_heartbeat = now + HEARTBEAT_S
        try:
            self._pub.send(orjson.dumps({"o": self.origin, "s": samples}), self._zmq.NOBLOCK)
        except self._zmq.ZMQError:  # PUB drops rather than blocks; anything else loses one message
            logger.debug("continuum: stats message not sent", exc_info=True)

    def _receive(self, now: float) -> None:
        if self._sub is None:
            return
        for _ in range(self.max_messages_per_poll):
            try:
                raw = self._sub.recv(self._zmq.NOBLOCK)
            except self._zmq.Again:
                break
            self._take(raw, now)

    def _take(self, raw: bytes, now: float) -> None:
        try:
            msg = orjson.loads(raw)
            origin, samples = msg["o"], msg["s"]
            if not isinstance(origin, str) or not isinstance(samples, list):
                raise TypeError("origin must be a string and samples a list")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            self.counters.malformed += 1
            logger.debug("continuum: malformed stats message ignored: %s", exc)
            return
        if origin == self.origin:
            return
        peer = self._peers.get(origin)
        if peer is None:
            peer = self._peers[origin] = _Peer()
            self._send_history = bool(self._history)  # a newcomer: it gets what we know
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(origin)
        peer.heard = now
        for item in samples:
            sample = _read_sample(item)
            if sample is None:
                self.counters.malformed += 1
            elif peer.take(sample[0]):
                if len(self._inbox) >= self.max_inbox:
                    self.counters.dropped += 1
                else:
                    self._inbox.append(sample[1:])
                    self.counters.received += 1


def _read_sample(item) -> Optional[tuple[int, str, str, float]]:
    if not isinstance(item, list) or len(item) != 4:
        return None
    seq, kind, tool, value = item
    if (
        isinstance(seq, bool)
        or not isinstance(seq, int)
        or kind not in KINDS
        or not isinstance(tool, str)
        or len(tool) > MAX_TOOL_LEN
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        return None
    return seq, kind, tool, float(value)
