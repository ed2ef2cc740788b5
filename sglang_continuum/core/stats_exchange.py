"""Tool statistics shared between workers over zmq XPUB/SUB, so every worker's TTL model sees the
fleet's tool-time distribution and a worker that starts later is warm within a second.

Sockets and origins. Each worker binds one XPUB socket (``stats_publish_endpoint``) and connects
one SUB socket per peer endpoint (``stats_peer_endpoints``). What a SUB socket reads is the
samples of the worker at that endpoint: the socket is the origin, so a message cannot speak for
another worker. What a message says about its sender (``o``, a random id per process) only tells
that the sender restarted (its sequence numbers start again) or that the endpoint is this worker
itself (the list may name it, so every worker can be given the same list: that socket is closed).

Data-parallel ranks. With ``--dp-size N`` each rank binds its own endpoint (``rank_endpoint``:
the configured port + rank for tcp, a ``.dp<rank>`` suffix for ipc and inproc), subscribes to its
sibling ranks' endpoints, and to every rank's endpoint of each peer (peers run the same
``--dp-size``). A peer endpoint's sockets are read once its socket for this rank has said whose it
is, so an entry that names this server (under another address) never delivers a sibling twice.

Trust. With CURVE keys (``keys``: one key pair that every worker of the fleet holds) the XPUB
admits only subscribers that hold the key (ZAP) and each SUB talks only to a publisher that holds
it: without the key one can neither read nor inject. Without keys every tcp endpoint must be
loopback (``check_local``), so only processes on this host reach the sockets. Either way a
message is bounded: at most ``max_message_bytes`` (zmq's MAXMSGSIZE drops a larger one unread;
checked again after ``recv`` for inproc), the keys of ``MESSAGE_KEYS``, ``MAX_SAMPLES_PER_MESSAGE``
samples that ``tool_stats.valid_sample`` accepts, and each origin adds at most
``MAX_TOOLS_PER_PEER`` distinct tools; what breaks a bound is counted (``malformed``), never
raised. Within these bounds a key holder steers the fleet's tool distribution: it is trusted.

History. XPUB hands up every subscription (``XPUB_VERBOSE``): when someone subscribes, the
publisher re-sends its recent history (the last ``history`` samples) at its next allowed poll. The
subscriber is connected by then, whichever side started first, and it gets warm whether or not it
publishes itself or is in the publisher's own peer list.

Gaps. PUB drops what overflows a full queue, so every message also says which of its sender's
samples can still be had (``f``: the oldest sequence number in its history) and the newest one
published (``h``). A worker that, after merging, still lacks some sample in that range puts the
peer in its own next message with the last sequence number up to which it has everything (``n``:
``{peer's id: seq}``); the peer then re-sends its history after that number. History re-sends
happen at most once every ``HEARTBEAT_S``; a caught-up fleet exchanges heartbeats only.

Loss-tolerant by construction: sends and receives are non-blocking and bounded per call, and
nothing ever waits on a peer, so a slow or dead peer costs nothing but its samples. Each poll
reads at most ``max_messages_per_poll`` messages, ``max_poll_bytes`` and ``parse_budget_s`` of
parsing (the rest waits in zmq's queue, ``queue_messages`` per socket), and hands out at most
``max_merge_per_poll`` samples, so a newcomer's burst of histories spreads over several steps.
Per origin the receiver keeps the sequence number up to which it has merged everything, plus (at
most ``history``) ones merged above a gap, so a sample repeated by re-sends is merged at most once.
A gap is filled while its samples are still in the sender's history; one older than that is given
up. A zmq error other than a full queue turns the exchange off for good (logged once, counted):
the worker serves on with its local statistics.

Nothing here knows SGLang: the controller hands samples in (``record``) and merges what ``poll``
returns; the adapter calls ``poll`` from the scheduler's step and idle loop.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
import weakref
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import orjson

from sglang_continuum.core.stats_endpoints import SIBLINGS, CurveKeys, FleetKey, links, rank_endpoint
from sglang_continuum.core.tool_stats import DURATION as DURATION  # re-exported: the kinds workers share
from sglang_continuum.core.tool_stats import OUTCOME as OUTCOME
from sglang_continuum.core.tool_stats import Sample, valid_sample

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.5  # a quiet worker still announces itself this often; history re-sends at most this often
ALIVE_S = 5.0  # a peer heard within this long counts as alive
MAX_ID_LEN = 64
MAX_SAMPLES_PER_MESSAGE = 256
MAX_TOOLS_PER_PEER = 128  # one origin cannot push the fleet's tools out of the 1,024 windows
MAX_MESSAGE_BYTES = 64 * 1024  # 256 samples of 128-character ASCII names are ~45 KB; a larger one goes in halves
MESSAGE_KEYS = frozenset("ofhns")  # origin, first in history, highest published, gap requests, samples
PARSE_BUDGET_S = 0.002  # scheduler-thread time one poll may spend reading peers' messages


@dataclass(slots=True)
class ExchangeCounters:
    sent: int = 0  # samples published (history re-sends not counted again)
    received: int = 0  # peers' new samples taken in (handed to the controller by poll)
    dropped: int = 0  # samples lost here: the outbox or inbox was full, or a peer's tool over its bound
    malformed: int = 0  # messages or samples that could not be read or broke a bound (ignored)
    errors: int = 0  # zmq errors that turned the exchange off (it stays off: at most one)


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


@dataclass(slots=True)
class _Source:
    """One SUB socket, connected to one peer endpoint: everything read from it is that peer's."""

    endpoint: str
    socket: Any
    group: int  # the configured peer endpoint it comes from (SIBLINGS: this server's own ranks)
    decides: bool  # the group's socket for this rank: its first message says whether the group is us
    peer: _Peer = field(default_factory=_Peer)
    id: Optional[str] = None  # what the peer calls itself; a new id is a restart (sequence numbers again)
    tools: set[str] = field(default_factory=set)  # distinct tools taken from this origin (bounded)


class StatsExchange:
    def __init__(
        self,
        publish_endpoint: Optional[str],
        peer_endpoints: Sequence[str] = (),
        *,
        keys: Optional[CurveKeys] = None,
        dp_rank: int = 0,
        dp_size: int = 1,
        interval_s: float = 0.1,
        history: int = 1024,
        max_outbox: int = 4096,
        max_messages_per_poll: int = 16,
        max_poll_bytes: int = 4 * MAX_MESSAGE_BYTES,
        parse_budget_s: float = PARSE_BUDGET_S,
        max_merge_per_poll: int = 64,
        max_inbox: int = 16_384,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        queue_messages: int = 64,  # x max_message_bytes: 4 MB per socket at most
        max_peers: int = 256,
        origin: Optional[str] = None,
        timer: Callable[[], float] = time.perf_counter,  # measures parse_budget_s
    ) -> None:
        import zmq

        subscriptions = links(publish_endpoint, peer_endpoints, keys is not None, dp_rank, dp_size, max_peers)
        self._zmq = zmq
        self.origin = origin or uuid.uuid4().hex[:16]
        self.interval_s = interval_s
        self.max_outbox, self.max_inbox, self.max_ahead = max_outbox, max_inbox, max(history, 1)
        self.max_messages_per_poll, self.max_merge_per_poll = max_messages_per_poll, max_merge_per_poll
        self.max_poll_bytes, self.parse_budget_s, self._timer = max_poll_bytes, parse_budget_s, timer
        self.max_message_bytes = max_message_bytes
        self._turn = 0  # which ready socket a poll reads first (rotates: none is always last)
        self.counters = ExchangeCounters()
        self._keys = keys
        self._context = zmq.Context()
        self._auth = self._pub = None
        self._sources: dict[Any, _Source] = {}  # by socket
        # released at interpreter exit too, if nobody closed it: a zmq context left to the garbage
        # collector at exit can block the process in ``term`` for good
        # (the finalizer holds the sockets: collected first, they could no longer be closed)
        self._owned: list[Any] = []  # authenticator and sockets, each closed before the context ends
        self._release = weakref.finalize(self, _release, self._context, self._owned)
        self._groups: dict[int, Optional[bool]] = {SIBLINGS: True}  # True: a peer's; False: us; None: not yet known
        self._poller = zmq.Poller()
        try:
            if publish_endpoint:
                self._bind(rank_endpoint(publish_endpoint, dp_rank), queue_messages)
            for endpoint, group, decides in subscriptions:
                self._connect(endpoint, group, decides, queue_messages)
        except zmq.ZMQError:
            self.close()
            raise
        self._seq = 0
        self._outbox: deque[tuple[int, str, str, float]] = deque()  # not yet published
        self._history: deque[tuple[int, str, str, float]] = deque(maxlen=history)  # what a newcomer gets
        self._inbox: deque[Sample] = deque()  # received, not yet handed out (merging is bounded per poll)
        self._resend_after: Optional[int] = None  # re-send the history after this sequence number
        self._next_resend = self._next_poll = self._next_heartbeat = -math.inf

    def _bind(self, endpoint: str, queue_messages: int) -> None:
        """The publisher: with keys, only subscribers holding the fleet's key are admitted."""
        zmq = self._zmq
        if self._keys is not None:
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(self._context)
            self._owned.append(self._auth)
            self._auth.start()
            self._auth.configure_curve_callback("*", FleetKey(self._keys[0]))
        self._pub = self._socket(zmq.XPUB, queue_messages, endpoint)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription, not just the first
        self._pub.setsockopt(zmq.MAXMSGSIZE, 1024)  # subscribers send subscriptions only
        self._pub.bind(endpoint)
        path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""
        if path and not path.startswith("@"):  # a file, not Linux's abstract namespace
            os.chmod(path, 0o600)  # connecting needs write access: the server's user alone, whatever the umask

    def _connect(self, endpoint: str, group: int, decides: bool, queue_messages: int) -> None:
        """One subscriber socket per peer endpoint: what arrives on it is that peer's."""
        zmq = self._zmq
        sock = self._socket(zmq.SUB, queue_messages, endpoint)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)  # zmq connects (and reconnects) in the background
        self._sources[sock] = _Source(endpoint, sock, group, decides)
        self._groups.setdefault(group, None)
        if group == SIBLINGS or decides:
            self._poller.register(sock, zmq.POLLIN)

    def _socket(self, kind: int, queue_messages: int, endpoint: str):
        zmq = self._zmq
        sock = self._context.socket(kind)
        self._owned.append(sock)
        sock.setsockopt(zmq.LINGER, 0)  # closing never waits for a peer
        if endpoint.startswith("tcp://["):  # zmq refuses an IPv6 address without it ("No such device")
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.SNDHWM if kind == zmq.XPUB else zmq.RCVHWM, queue_messages)
        if self._keys is not None:
            public, secret = self._keys
            sock.curve_publickey, sock.curve_secretkey = public, secret
            if kind == zmq.XPUB:
                sock.curve_server = True
            else:
                sock.curve_serverkey = public  # the publisher must hold the fleet's secret key
        return sock

    # -- the controller's side -------------------------------------------------------------
    def record(self, kind: str, tool: str, value: float) -> None:
        """A sample recorded here; published at the next ``poll``. Never blocks. One the peers
        would refuse (``valid_sample``) is not published."""
        if self._pub is None:
            return
        if len(self._outbox) >= self.max_outbox or not valid_sample(kind, tool, value):
            self.counters.dropped += 1
            return
        self._seq += 1
        sample = (self._seq, kind, tool, float(value))
        self._outbox.append(sample)
        self._history.append(sample)

    def poll(self, now: float) -> list[Sample]:
        """At most every ``interval_s``: publish what is new here and take in the peers' messages.
        Returns at most ``max_merge_per_poll`` of the peers' new samples, so a burst (a peer's
        history) is merged over several steps. Non-blocking and never raising (a zmq error turns
        the exchange off: ``_fail``); between intervals, with nothing to hand out, two comparisons."""
        if now >= self._next_poll:
            self._next_poll = now + self.interval_s
            try:
                self._hear_subscribers()  # first: a newcomer subscribed now gets our history at once
                self._receive(now)
                self._publish(now)
            except self._zmq.ZMQError as exc:  # ``Again`` is handled where it is raised: this is not transient
                self._fail(exc)
        if not self._inbox:
            return []
        inbox = self._inbox
        return [inbox.popleft() for _ in range(min(len(inbox), self.max_merge_per_poll))]

    def peers_alive(self, now: float) -> int:
        return sum(1 for s in self._sources.values() if now - s.peer.heard <= ALIVE_S)

    def close(self) -> None:
        self._next_poll = math.inf  # a closed exchange never touches its sockets again
        self._pub = None
        self._sources = {}
        self._auth = None
        self._release()

    def _fail(self, exc: Exception) -> None:
        """A zmq error no retry fixes: off for good (what the inbox holds is still handed out)."""
        if self.counters.errors == 0:
            logger.error("continuum: shared tool statistics are off (zmq: %s); serving on local statistics", exc)
        self.counters.errors += 1
        self.close()

    def check_integrity(self) -> None:
        assert self.counters.errors == 0 or (self._pub is None and not self._sources), "a failed exchange left on"
        assert len(self._outbox) <= self.max_outbox, "stats outbox over its bound"
        assert len(self._inbox) <= self.max_inbox, "stats inbox over its bound"
        seqs = [s[0] for s in self._history]
        assert seqs == sorted(set(seqs)), "stats history out of order"
        for source in self._sources.values():
            peer = source.peer
            assert self._groups[source.group] is not False, "a socket to this worker itself left open"
            assert len(source.tools) <= MAX_TOOLS_PER_PEER, "too many tools from one peer"
            assert peer.done >= 0 and len(peer.ahead) <= self.max_ahead, "peer's merged sequence numbers"
            assert all(seq > peer.done + 1 for seq in peer.ahead), "peer's gap not settled"

    # -- internals -------------------------------------------------------------------------
    def _hear_subscribers(self) -> None:
        if self._pub is None:
            return
        for _ in range(self.max_messages_per_poll):
            try:
                msg = self._pub.recv(self._zmq.NOBLOCK)
            except self._zmq.Again:
                return
            if msg[:1] == b"\x01":  # a subscription: a newcomer, or a peer that reconnected
                self._want_resend(0)

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
        header = {"o": self.origin, "f": first, "h": self._seq}
        missing: dict[str, int] = {}
        for source in self._sources.values():
            peer = source.peer
            if source.id is not None and peer.missing() and now - peer.heard <= ALIVE_S:
                missing[source.id] = min(missing.get(source.id, peer.done), peer.done)
        if missing:
            header["n"] = missing
        for start in range(0, max(len(samples), 1), MAX_SAMPLES_PER_MESSAGE):
            for raw in self._encode(header, samples[start : start + MAX_SAMPLES_PER_MESSAGE]):
                try:
                    self._pub.send(raw, self._zmq.NOBLOCK)
                except self._zmq.Again:  # PUB drops rather than blocks; what is left goes with the next
                    return

    def _encode(self, header: dict, samples: list) -> list[bytes]:
        """Messages of at most ``max_message_bytes`` (a larger one would cost the peer its
        connection): halved until each fits; a single sample that cannot fit is dropped."""
        raw = orjson.dumps({**header, "s": samples})
        if len(raw) <= self.max_message_bytes:
            return [raw]
        if len(samples) <= 1:
            self.counters.dropped += len(samples)
            return []
        half = len(samples) // 2
        return self._encode(header, samples[:half]) + self._encode(header, samples[half:])

    def _receive(self, now: float) -> None:
        """At most ``max_messages_per_poll`` messages, ``max_poll_bytes`` and ``parse_budget_s``
        (checked between messages) per poll, one message per socket per pass, the first socket
        rotating: a busy or hostile peer cannot starve the rest, nor stall the scheduler."""
        ready = [self._sources[sock] for sock, _ in self._poller.poll(0)]
        if ready:
            self._turn = k = (self._turn + 1) % len(ready)
            ready = ready[k:] + ready[:k]
        budget, left, end = self.max_messages_per_poll, self.max_poll_bytes, self._timer() + self.parse_budget_s
        while ready:
            more = []
            for source in ready:
                if source.socket.closed:
                    continue
                try:
                    raw = source.socket.recv(self._zmq.NOBLOCK)
                except self._zmq.Again:
                    continue
                budget, left = budget - 1, left - len(raw)
                self._take(source, raw, now)
                if budget <= 0 or left <= 0 or self._timer() >= end:
                    return
                more.append(source)
            ready = more

    def _take(self, source: _Source, raw: bytes, now: float) -> None:
        try:
            msg = _read_message(raw, self.max_message_bytes)
        except (ValueError, KeyError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
            self.counters.malformed += 1
            logger.debug("continuum: malformed stats message ignored: %s", exc)
            return
        origin, samples = msg["o"], msg["s"]
        if origin == self.origin:  # this endpoint is this worker itself (the list may name it)
            if source.group != SIBLINGS:
                self._set_group(source.group, False)
            return
        if source.decides and self._groups[source.group] is None:
            self._set_group(source.group, True)
        if source.id != origin:
            if source.id is not None:  # the peer restarted: its sequence numbers start again
                source.peer = _Peer()
            source.id = origin
        peer = source.peer
        peer.heard = now
        for item in samples:
            seq = item[0] if isinstance(item, list) and item else None
            if not _is_int(seq) or seq < 1:
                self.counters.malformed += 1
            elif peer.take(seq, self.max_ahead):  # an unreadable sample is not asked for again
                sample = _read_sample(item)
                if sample is None:
                    self.counters.malformed += 1
                elif len(self._inbox) >= self.max_inbox or not self._tool_allowed(source, sample[2]):
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

    def _tool_allowed(self, source: _Source, tool: str) -> bool:
        if tool not in source.tools and len(source.tools) < MAX_TOOLS_PER_PEER:
            source.tools.add(tool)
        return tool in source.tools

    def _set_group(self, group: int, is_peer: bool) -> None:
        """A peer endpoint's socket for this rank has spoken: read the group's other ranks too, or
        (it is this server) close them all."""
        self._groups[group] = is_peer
        for sock, source in list(self._sources.items()):
            if source.group != group:
                continue
            if not is_peer:
                if source.decides:
                    self._poller.unregister(sock)
                del self._sources[sock]
                sock.close(linger=0)
            elif not source.decides:
                self._poller.register(sock, self._zmq.POLLIN)

    def _want_resend(self, after: int) -> None:
        """A peer lacks some of our samples after ``after``: re-send them (at the next allowed poll)."""
        if self._history and after < self._seq:
            self._resend_after = after if self._resend_after is None else min(self._resend_after, after)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_message(raw: bytes, max_bytes: int) -> dict:
    """A peer's message, its envelope checked (its samples are read one by one: ``_read_sample``)."""
    if len(raw) > max_bytes:  # zmq's MAXMSGSIZE does not apply to inproc
        raise ValueError(f"{len(raw)} bytes")
    msg = orjson.loads(raw)
    if not isinstance(msg, dict) or not msg.keys() <= MESSAGE_KEYS:
        raise TypeError(f"a message is an object with keys among {''.join(sorted(MESSAGE_KEYS))}")
    origin, samples = msg["o"], msg["s"]
    if not (isinstance(origin, str) and len(origin) <= MAX_ID_LEN):
        raise TypeError("origin must be a short string")
    if not (isinstance(samples, list) and len(samples) <= MAX_SAMPLES_PER_MESSAGE):
        raise TypeError(f"samples must be a list of at most {MAX_SAMPLES_PER_MESSAGE}")
    return msg


def _read_sample(item) -> Optional[tuple[int, str, str, float]]:
    if isinstance(item, list) and len(item) == 4 and _is_int(item[0]) and valid_sample(*item[1:]):
        return item[0], item[1], item[2], float(item[3])
    return None


def _release(context: Any, owned: list) -> None:
    """Stop the authenticator, close every socket without lingering, end the context. Never
    raises: it also runs after a zmq error (``_fail``)."""
    for thing in owned:
        with suppress(Exception):
            thing.stop() if hasattr(thing, "stop") else thing.close(linger=0)
    owned.clear()
    with suppress(Exception):
        context.term()
