"""Tool statistics shared between workers over zmq PUB/SUB, so every worker's TTL model sees the
fleet's tool-time distribution and a worker that starts later is warm within a second.

Each worker binds one PUB socket (``stats_publish_endpoint``) and connects one SUB socket to its
peers (``stats_peer_endpoints``; the list may name the worker's own endpoint: its own messages
are ignored, so every worker can be given the same list). At most every ``interval_s`` a worker
publishes the samples it recorded since its last message (at least a heartbeat every
``HEARTBEAT_S``) and merges what its peers sent. Its recent history (the last ``history``
samples) is what it re-sends: at once when it hears a peer it has not heard before, which is how a
late or restarted worker gets warm, and again whenever a peer says it is missing some of it.

PUB/SUB loses what is published before a subscriber has connected (the "slow joiner") and what
overflows a full queue, so every message also says which of its sender's samples can still be had
(``f``: the oldest sequence number in its history) and the newest one published (``h``). A worker
that, after merging, still lacks some sample in that range puts the peer in its own next message
with the last sequence number up to which it has everything (``n``: ``{origin: seq}``); the peer
then re-sends its history after that number, at most once every ``HEARTBEAT_S``. A worker that
has everything asks for nothing, so a caught-up fleet exchanges heartbeats only.

Loss-tolerant by construction: sends and receives are non-blocking and bounded per call, PUB drops
for a subscriber whose queue is full, and nothing ever waits on a peer, so a slow or dead peer
costs nothing but its samples. Merging is bounded too: each poll hands out at most
``max_merge_per_poll`` samples, so a newcomer's burst of histories spreads over several steps.
Every sample carries ``(origin, seq)``; per origin the receiver keeps the sequence number up to
which it has merged everything, plus (at most ``history``) ones merged above a gap, and takes only
samples it has not merged, so a sample repeated by re-sends is merged at most once. A gap is
filled by a re-send while its samples are still in the sender's history; one older than that is
given up.

Nothing here knows SGLang: the controller hands samples in (``record``) and merges what ``poll``
returns; the adapter calls ``poll`` from the scheduler's step and idle loop.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
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
    done: int = 0  # every sequence number up to here is merged (or no longer to be had)
    ahead: set[int] = field(default_factory=set)  # merged above ``done``, past a gap
    latest: int = 0  # the newest sequence number the peer says it has published
    heard: float = -math.inf

    def take(self, seq: int, max_ahead: int) -> bool:
        """Whether ``seq`` is new (not merged yet); marks it merged."""
        if seq == self.done + 1 and not self.ahead:  # in order: the usual case
            self.done = seq
            return True
        if seq <= self.done or seq in self.ahead:
            return False
        self.ahead.add(seq)
        self._settle(self.done)
        if len(self.ahead) > max_ahead:  # too many gaps below: give the lowest one up
            self._settle(min(self.ahead))
        return True

    def gone_before(self, first: int) -> None:
        """The peer's history starts at ``first``: what is older can no longer be had."""
        if first - 1 > self.done:
            self._settle(first - 1)

    def missing(self) -> bool:
        return self.latest > self.done

    def _settle(self, done: int) -> None:
        ahead = self.ahead
        if done > self.done:
            ahead.difference_update([seq for seq in ahead if seq <= done])
        while done + 1 in ahead:
            done += 1
            ahead.remove(done)
        self.done = done


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
        self.max_ahead = max(history, 1)
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
        self._resend_after: Optional[int] = None  # re-send the history after this sequence number
        self._next_resend = -math.inf
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
            assert peer.done >= 0 and len(peer.ahead) <= self.max_ahead, "peer's merged sequence numbers"
            assert all(seq > peer.done + 1 for seq in peer.ahead), "peer's gap not settled"

    # -- internals -------------------------------------------------------------------------
    def _publish(self, now: float) -> None:
        if self._pub is None:
            return
        resend = self._resend_after is not None and now >= self._next_resend
        if not (resend or self._outbox or now >= self._next_heartbeat):
            return
        samples = list(self._outbox)
        if resend:  # the history after what the peers have, up to the outbox (sent anyway)
            after, end = self._resend_after, samples[0][0] if samples else self._seq + 1
            samples = [s for s in self._history if after < s[0] < end] + samples
            self._resend_after = None
            self._next_resend = now + HEARTBEAT_S
        self.counters.sent += len(self._outbox)
        self._outbox.clear()
        self._next_heartbeat = now + HEARTBEAT_S
        first = self._history[0][0] if self._history else self._seq + 1
        msg = {"o": self.origin, "s": samples, "f": first, "h": self._seq}
        missing = {o: p.done for o, p in self._peers.items() if p.missing() and now - p.heard <= ALIVE_S}
        if missing:
            msg["n"] = missing
        try:
            self._pub.send(orjson.dumps(msg), self._zmq.NOBLOCK)
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
            self._want_resend(0)  # a newcomer: it gets what we know
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(origin)
        peer.heard = now
        for item in samples:
            seq = item[0] if isinstance(item, list) and item else None
            if not _is_int(seq) or seq < 1:
                self.counters.malformed += 1
            elif peer.take(seq, self.max_ahead):  # an unreadable sample is not asked for again
                sample = _read_sample(item)
                if sample is None:
                    self.counters.malformed += 1
                elif len(self._inbox) >= self.max_inbox:
                    self.counters.dropped += 1
                else:
                    self._inbox.append(sample[1:])
                    self.counters.received += 1
        first, latest, missing = msg.get("f"), msg.get("h"), msg.get("n")
        if _is_int(first):
            peer.gone_before(first)
        if _is_int(latest):
            peer.latest = max(peer.latest, latest)
        if isinstance(missing, dict):
            done = missing.get(self.origin)
            if _is_int(done):
                self._want_resend(done)

    def _want_resend(self, after: int) -> None:
        """A peer lacks some of our samples after ``after``: re-send them (at the next allowed poll)."""
        if self._history and after < self._seq:
            self._resend_after = after if self._resend_after is None else min(self._resend_after, after)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
