"""Tool statistics shared over real zmq sockets (tcp on localhost, ipc): samples recorded on one
worker's controller change another's TTL decision; late peers get warm whichever side connects
first; dead peers cost nothing; only key holders take part, a peer speaks only for itself, a
message's reach is bounded; every data-parallel rank shares."""

import errno
import subprocess
import sys
import textwrap
import time

import orjson
import pytest
import zmq
import zmq.auth

from sglang_continuum.core.metadata import MAX_TOOL_NAME_LEN, ProgramMeta
from sglang_continuum.core.settings import ContinuumSettings
from sglang_continuum.core.stats_exchange import (
    DURATION,
    MAX_MESSAGE_BYTES,
    MAX_SAMPLES_PER_MESSAGE,
    MAX_TOOLS_PER_PEER,
    OUTCOME,
    StatsExchange,
)
from sglang_continuum.core.tool_stats import MAX_DURATION_S, ToolStats
from sglang_continuum.core.ttl import TTLQuery
from tests.support import controller as make_controller
from tests.support import free_port, port_is_free

DEADLINE_S = 20.0  # generous: only reached when the behaviour under test is broken


def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def worker(publish, peers, **kw):
    controller, _ = make_controller("cost", budget=100_000, cold_start_k=20)
    exchange = StatsExchange(publish, peers, interval_s=0.0, **kw)
    controller.share_sample = exchange.record
    return controller, exchange


def pump(pairs, until, deadline_s=DEADLINE_S, relay=None):
    """Poll every (controller, exchange) until ``until()`` holds; False at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for controller, exchange in pairs:
            controller.merge_peer_samples(exchange.poll(time.monotonic()))
        if relay is not None:
            relay.forward()
        if until():
            return True
        time.sleep(0.01)
    return False


def run_program(controller, pid, tool, tool_s):
    """One program: turn 1 finishes, the tool takes ``tool_s``, turn 2 arrives (a sample)."""
    controller.turn_arrived(ProgramMeta(pid))
    controller.turn_finished(ProgramMeta(pid, tool_name=tool), context_tokens=500, handle=None)
    controller.clock.advance(tool_s)
    controller.turn_arrived(ProgramMeta(pid, is_last_step=True))


def samples(controller, tool):
    window = controller.stats.tool(tool)
    return sorted(window.samples()) if window is not None else []


class Relay:
    """A's messages reach B only through here: a SUB that the test connects to A's endpoint when it
    chooses (until then B has no route to A), and a PUB that B subscribes to. ``drop`` picks the
    messages that are lost on the way; ``seen`` keeps every message that came through."""

    def __init__(self, upstream):
        ctx = zmq.Context.instance()
        self.upstream, self.endpoint = upstream, endpoint()
        self.sub, self.pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
        for sock in (self.sub, self.pub):
            sock.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.pub.bind(self.endpoint)
        self.drop = lambda msg: False
        self.seen = []

    def connect(self):
        self.sub.connect(self.upstream)

    def forward(self):
        while True:
            try:
                raw = self.sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = orjson.loads(raw)
            self.seen.append(msg)
            if not self.drop(msg):
                self.pub.send(raw)

    def close(self):
        self.sub.close(linger=0)
        self.pub.close(linger=0)


@pytest.fixture
def closing():
    made = []
    yield made.append
    for exchange in made:
        exchange.close()


def test_samples_recorded_on_a_change_the_ttl_on_b(closing):
    ea, eb = endpoint(), endpoint()
    a, xa = worker(ea, [ea, eb])  # every worker may be given the same list, itself included
    b, xb = worker(eb, [ea, eb])
    closing(xa), closing(xb)
    query = TTLQuery("pytest", 50_000)
    before = b.ttl_model.decide(query)
    for i in range(40):
        run_program(a, f"p{i}", "pytest", 0.01 * (i + 1))
    assert pump([(a, xa), (b, xb)], lambda: len(samples(b, "pytest")) == 40)
    assert samples(b, "pytest") == samples(a, "pytest")  # each sample merged exactly once
    assert b.stats.return_probability("pytest") == a.stats.return_probability("pytest")
    after = b.ttl_model.decide(query)
    assert before.source == "cold" and after.source == "tool" and after.samples == 40
    assert after == a.ttl_model.decide(query) and after.ttl > 0 and after.ttl != before.ttl
    assert xa.counters.sent == 80 and xb.counters.received == 80  # 40 durations + 40 outcomes
    assert samples(a, "pytest") and xb.counters.sent == 0  # B recorded nothing, so it shared nothing
    xa.check_integrity(), xb.check_integrity()


def test_a_late_peer_gets_the_history_and_nobody_counts_it_twice(closing):
    ea, eb, ec = endpoint(), endpoint(), endpoint()
    everyone = [ea, eb, ec]
    a, xa = worker(ea, everyone)
    b, xb = worker(eb, everyone)
    closing(xa), closing(xb)
    for i in range(10):
        run_program(a, f"p{i}", "grep", 2.0)
    assert pump([(a, xa), (b, xb)], lambda: len(samples(b, "grep")) == 10)
    c, xc = worker(ec, everyone)  # starts after the samples were recorded
    closing(xc)
    assert pump([(a, xa), (b, xb), (c, xc)], lambda: len(samples(c, "grep")) == 10)
    pump([(a, xa), (b, xb), (c, xc)], lambda: False, deadline_s=1.0)  # A's history re-send reaches B too
    assert len(samples(b, "grep")) == 10 and len(samples(c, "grep")) == 10
    assert xa.peers_alive(time.monotonic()) == 2


def test_a_killed_peer_does_not_stall_the_others(closing):
    ea, eb, ec = endpoint(), endpoint(), endpoint()
    script = textwrap.dedent(
        f"""
        import sys, time
        from sglang_continuum.core.stats_exchange import StatsExchange
        x = StatsExchange({ea!r}, [{eb!r}], interval_s=0.0)
        print("up", flush=True)
        while True:
            x.record("d", "dead-tool", 1.0)
            x.poll(time.monotonic())
            time.sleep(0.01)
        """
    )
    peer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert peer.stdout.readline().strip() == b"up"
        b, xb = worker(eb, [ea, ec])
        c, xc = worker(ec, [eb])
        closing(xb), closing(xc)
        assert pump([(b, xb), (c, xc)], lambda: len(samples(b, "dead-tool")) > 0)
    finally:
        peer.kill()
        peer.wait()
    pump([(b, xb), (c, xc)], lambda: False, deadline_s=0.5)  # what was already queued before the kill
    seen = len(samples(b, "dead-tool"))
    for i in range(5):
        run_program(b, f"q{i}", "make", 3.0)
    # B keeps polling a dead endpoint and its live peer still gets everything B records
    assert pump([(b, xb), (c, xc)], lambda: len(samples(c, "make")) == 5)
    assert len(samples(b, "dead-tool")) == seen


def test_bounded_outbox_and_malformed_messages(closing):
    ea, eb = endpoint(), endpoint()
    x = StatsExchange(ea, [eb], interval_s=0.0, max_outbox=4)
    closing(x)
    for _ in range(6):
        x.record(DURATION, "t", 1.0)
    assert x.counters.dropped == 2
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.PUB)
    rogue.bind(eb)
    try:
        bad = [b"not json", b'{"o": 1, "s": []}', b'{"o": "r", "s": [[1, "d", "t", -1], [2, "x", "t", 1], "y"]}']
        good = b'{"o": "r", "s": [[3, "d", "t", 2.5]]}'
        got = []

        def until():
            for msg in (*bad, good):
                rogue.send(msg)
            got.extend(x.poll(time.monotonic()))
            return bool(got)

        end = time.monotonic() + DEADLINE_S
        while not until() and time.monotonic() < end:
            time.sleep(0.02)
        assert got[0] == (DURATION, "t", 2.5) and x.counters.malformed >= 5
        x.check_integrity()
    finally:
        rogue.close(linger=0)


def test_settings_read_endpoint_lists_and_refuse_bad_ones():
    s = ContinuumSettings.load({"SGLANG_CONTINUUM_STATS_PEER_ENDPOINTS": "tcp://127.0.0.1:1, ipc:///tmp/x"})
    assert s.stats_peer_endpoints == ("tcp://127.0.0.1:1", "ipc:///tmp/x")
    with pytest.raises(ValueError, match="must start with"):
        ContinuumSettings.load({"SGLANG_CONTINUUM_STATS_PUBLISH_ENDPOINT": "localhost:5701"})


def test_a_burst_is_merged_a_bounded_slice_per_poll(closing):
    ea, eb = endpoint(), endpoint()
    a, xa = worker(ea, [eb])
    closing(xa)
    for i in range(200):
        run_program(a, f"p{i}", "ls", 0.5)  # 400 samples in A's history before B exists
    b, xb = worker(eb, [ea], max_merge_per_poll=64)
    closing(xb)
    sizes = []

    def merged_all():
        a.merge_peer_samples(xa.poll(time.monotonic()))
        got = xb.poll(time.monotonic())
        sizes.append(len(got))
        b.merge_peer_samples(got)
        return len(samples(b, "ls")) == 200

    end = time.monotonic() + DEADLINE_S
    while not merged_all() and time.monotonic() < end:
        time.sleep(0.01)
    assert len(samples(b, "ls")) == 200 and max(sizes) == 64 and sum(sizes) == 400


def test_a_history_resend_lost_before_the_peer_connected_is_sent_again(closing):
    """The slow joiner: A publishes its samples and hears B while B's SUB has no route to A, so A's
    live messages are lost. B still gets every sample once its route comes up (A hears the relay
    subscribe and re-sends its history), each once."""
    ea, eb = endpoint(), endpoint()
    relay = Relay(ea)
    closing(relay)
    a, xa = worker(ea, [eb])
    b, xb = worker(eb, [relay.endpoint])
    closing(xa), closing(xb)
    for i in range(10):
        run_program(a, f"p{i}", "grep", 0.5 * (i + 1))  # 20 samples in A's history
    # A publishes them, hears B (new: its history goes out at once) -- and B hears nothing of it
    assert pump([(a, xa), (b, xb)], lambda: xa.peers_alive(time.monotonic()) == 1)
    assert xa.counters.sent == 20 and xb.counters.received == 0
    relay.connect()  # B's route to A comes up only now
    assert pump([(a, xa), (b, xb)], lambda: xb.counters.received == xa.counters.sent, relay=relay), (
        xa.counters,
        xb.counters,
    )
    assert samples(b, "grep") == samples(a, "grep")  # each sample merged exactly once
    # caught up: in-flight requests settle, then A sends heartbeats only (no history every period)
    pump([(a, xa), (b, xb)], lambda: False, deadline_s=1.0, relay=relay)
    relay.seen.clear()
    pump([(a, xa), (b, xb)], lambda: False, deadline_s=1.5, relay=relay)
    assert relay.seen and all(msg["s"] == [] for msg in relay.seen), relay.seen
    assert xb.counters.received == xa.counters.sent == 20 and len(samples(b, "grep")) == 10
    xa.check_integrity(), xb.check_integrity()


def test_a_message_lost_mid_stream_is_filled_from_the_history(closing):
    ea, eb = endpoint(), endpoint()
    relay = Relay(ea)
    closing(relay)
    relay.connect()
    a, xa = worker(ea, [eb])
    b, xb = worker(eb, [relay.endpoint])
    closing(xa), closing(xb)
    now = time.monotonic
    assert pump([(a, xa), (b, xb)], lambda: xa.peers_alive(now()) == 1 and xb.peers_alive(now()) == 1, relay=relay)
    for i in range(5):
        run_program(a, f"p{i}", "make", 1.0 + i)
    assert pump([(a, xa), (b, xb)], lambda: xb.counters.received == 10, relay=relay)
    lost = []
    relay.drop = lambda msg: bool(msg["s"]) and not lost and not lost.append(msg)  # the next samples
    for i in range(5, 10):
        run_program(a, f"p{i}", "make", 1.0 + i)
    assert pump([(a, xa), (b, xb)], lambda: bool(lost), relay=relay)
    for i in range(10, 15):
        run_program(a, f"p{i}", "make", 1.0 + i)  # the samples after the gap arrive
    assert pump([(a, xa), (b, xb)], lambda: xb.counters.received == xa.counters.sent == 30, relay=relay), (
        xa.counters,
        xb.counters,
    )
    assert samples(b, "make") == samples(a, "make") and len(samples(b, "make")) == 15
    xa.check_integrity(), xb.check_integrity()


def test_a_peer_without_the_key_can_neither_inject_nor_read(closing):
    keys = zmq.curve_keypair()  # the fleet's
    ea, ex, plain_at, forged_at = endpoint(), endpoint(), endpoint(), endpoint()
    a, xa = worker(ea, [ex], keys=keys)
    x, xx = worker(ex, [ea, plain_at, forged_at], keys=keys)  # two listed endpoints taken by rogues
    closing(xa), closing(xx)
    ctx = zmq.Context.instance()
    other = zmq.curve_keypair()  # a key pair, but not the fleet's
    plain, forged = ctx.socket(zmq.PUB), ctx.socket(zmq.PUB)
    forged.curve_server, forged.curve_publickey, forged.curve_secretkey = True, *other
    spies = [ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)]
    spies[1].curve_serverkey, spies[1].curve_publickey, spies[1].curve_secretkey = keys[0], *other
    try:
        plain.bind(plain_at), forged.bind(forged_at)
        for spy in spies:
            spy.setsockopt(zmq.SUBSCRIBE, b""), spy.connect(ea)
        evil = orjson.dumps({"o": "rogue", "s": [[i, DURATION, "evil", 1.0] for i in range(1, 5)], "f": 1, "h": 4})
        for i in range(10):
            run_program(a, f"p{i}", "good", 1.0 + i)

        def delivered():
            plain.send(evil), forged.send(evil)
            return len(samples(x, "good")) == 10

        assert pump([(a, xa), (x, xx)], delivered)  # the key holders share ...
        pump([(a, xa), (x, xx)], lambda: delivered() and False, deadline_s=1.0)
        assert samples(x, "evil") == [] and xx.counters.received == 20  # ... nothing else got in
        for spy in spies:  # and nobody without the key read A's samples
            with pytest.raises(zmq.Again):
                spy.recv(zmq.NOBLOCK)
    finally:
        for sock in (plain, forged, *spies):
            sock.close(linger=0)


def test_a_peer_cannot_speak_for_another_origin(closing):
    eb, ex, er = endpoint(), endpoint(), endpoint()
    b, xb = worker(eb, [ex])
    x, xx = worker(ex, [er, eb])
    closing(xb), closing(xx)
    rogue = zmq.Context.instance().socket(zmq.PUB)  # a listed peer: it may share its own samples
    rogue.bind(er)
    try:
        # B's sequence numbers, and a history that claims B's samples are all gone
        spoof = {"o": xb.origin, "s": [[i, DURATION, "forged", 99.0] for i in range(1, 21)], "f": 2**62, "h": 2**62}
        now = time.monotonic

        def flooding():
            rogue.send(orjson.dumps(spoof))
            return xx.peers_alive(now()) == 2

        assert pump([(b, xb), (x, xx)], flooding)
        pump([(b, xb), (x, xx)], lambda: flooding() and False, deadline_s=0.5)
        for i in range(10):
            run_program(b, f"p{i}", "real", 1.0 + i)  # sequence numbers 1..20, the ones the rogue sent
        assert pump([(b, xb), (x, xx)], lambda: flooding() and len(samples(x, "real")) == 10)
        assert samples(x, "real") == samples(b, "real")
        xx.check_integrity()
    finally:
        rogue.close(linger=0)


def test_an_oversized_message_is_dropped_unread_and_a_message_can_do_little(closing):
    ex, er, et = endpoint(), endpoint(), endpoint()
    # a generous parse budget (the budget in time is another test's): a loaded machine must not
    # leave "small" queued until the big message behind it drops the connection
    x = StatsExchange(ex, [er, et], interval_s=0.0, max_message_bytes=16 * 1024, parse_budget_s=1.0)
    closing(x)
    ctx = zmq.Context.instance()
    rogue, tooler = ctx.socket(zmq.PUB), ctx.socket(zmq.PUB)
    rogue.bind(er), tooler.bind(et)
    try:
        small = orjson.dumps({"o": "r", "s": [[1, DURATION, "small", 2.5]]})
        big = orjson.dumps({"o": "r", "s": [[2, DURATION, "big", 9.0]], "pad": "x" * 20_000})
        many = orjson.dumps({"o": "r", "s": [[i, DURATION, "many", 1.0] for i in range(3, 303)]})  # > 256
        tools = orjson.dumps({"o": "t", "s": [[i, DURATION, f"tool{i}", 1.0] for i in range(1, 201)]})
        got = []

        def until():
            for msg in (small, many, big):  # zmq drops the connection at the big one (for good)
                rogue.send(msg)
            tooler.send(tools)
            got.extend(x.poll(time.monotonic()))
            return len(got) >= 1 + MAX_TOOLS_PER_PEER

        end = time.monotonic() + DEADLINE_S
        while not until() and time.monotonic() < end:
            time.sleep(0.02)
        time.sleep(0.1)
        got.extend(x.poll(time.monotonic()))
        names = [tool for _, tool, _ in got]
        assert names.count("small") == 1 and "big" not in names and "many" not in names
        assert len(set(names)) == 1 + MAX_TOOLS_PER_PEER  # "small" and 128 of the 200 tools
        x.check_integrity()
    finally:
        rogue.close(linger=0), tooler.close(linger=0)


def _history_on_a(closing, peers_of_a, ea=None):
    ea = ea or endpoint()
    a, xa = worker(ea, peers_of_a)
    closing(xa)
    for i in range(10):
        run_program(a, f"p{i}", "grep", 0.5 * (i + 1))  # 20 samples in A's history
    return ea, (a, xa)


@pytest.mark.parametrize("publishes", [False, True], ids=["subscriber-only", "publisher"])
def test_a_late_worker_missing_from_the_lists_is_warm_within_a_second(closing, publishes):
    eb = endpoint()
    ea, pa = _history_on_a(closing, [eb])  # A and B list each other only
    b, xb = worker(eb, [ea])
    closing(xb)
    assert pump([pa, (b, xb)], lambda: len(samples(b, "grep")) == 10)
    late, xl = worker(endpoint() if publishes else None, [ea])  # nobody lists it
    closing(xl)
    assert pump([pa, (b, xb), (late, xl)], lambda: len(samples(late, "grep")) == 10, deadline_s=1.0)
    assert samples(late, "grep") == samples(pa[0], "grep")


def test_a_subscriber_that_connects_first_is_warm_within_a_second_of_the_publisher(closing):
    ea = endpoint()
    late, xl = worker(None, [ea])  # subscribes before A exists (zmq retries the connection)
    closing(xl)
    pump([(late, xl)], lambda: False, deadline_s=0.3)
    _, pa = _history_on_a(closing, [], ea)
    assert pump([pa, (late, xl)], lambda: len(samples(late, "grep")) == 10, deadline_s=1.0)


def test_a_non_loopback_tcp_endpoint_without_keys_stops_start_up(tmp_path):
    for name, value in (
        ("STATS_PUBLISH_ENDPOINT", "tcp://0.0.0.0:5701"),
        ("STATS_PEER_ENDPOINTS", "tcp://worker-b:5701"),
    ):
        with pytest.raises(ValueError, match=f"{name.lower()}.*stats_key_file"):
            ContinuumSettings.load({f"SGLANG_CONTINUUM_{name}": value})
    with pytest.raises(ValueError, match="stats_publish_endpoint"):
        StatsExchange("tcp://0.0.0.0:5701", [])
    _, secret = zmq.auth.create_certificates(tmp_path, "fleet")
    keyed = ContinuumSettings.load(
        {"SGLANG_CONTINUUM_STATS_PUBLISH_ENDPOINT": "tcp://0.0.0.0:5701", "SGLANG_CONTINUUM_STATS_KEY_FILE": secret}
    )
    assert keyed.stats_key_file == secret
    local = {
        "SGLANG_CONTINUUM_STATS_PUBLISH_ENDPOINT": "tcp://127.0.0.1:5701",
        "SGLANG_CONTINUUM_STATS_PEER_ENDPOINTS": "ipc:///tmp/x",
    }
    assert ContinuumSettings.load(local).stats_key_file is None  # local endpoints need no keys
    with pytest.raises(ValueError, match="stats_key_file"):
        ContinuumSettings.load({**local, "SGLANG_CONTINUUM_STATS_KEY_FILE": str(tmp_path / "fleet.key")})  # public only


def port_pair() -> int:
    while not port_is_free((port := free_port()) + 1):
        pass
    return port


@pytest.mark.parametrize("listed", ["nothing", "itself", "itself by another name", "nothing, ipc"])
def test_two_dp_ranks_with_the_same_configured_endpoint_both_share(closing, tmp_path, listed):
    port = port_pair()
    configured = f"ipc://{tmp_path}/stats" if listed.endswith("ipc") else f"tcp://127.0.0.1:{port}"
    peers = {"itself": [configured], "itself by another name": [f"tcp://localhost:{port}"]}.get(listed, [])
    ranks = [worker(configured, peers, dp_rank=r, dp_size=2) for r in range(2)]
    for x in ranks:
        closing(x[1])
    for r, (c, _) in enumerate(ranks):
        for i in range(5):
            run_program(c, f"p{i}", f"tool{r}", 1.0 + i)
    (c0, x0), (c1, x1) = ranks
    assert pump(ranks, lambda: len(samples(c1, "tool0")) == 5 and len(samples(c0, "tool1")) == 5)
    pump(ranks, lambda: False, deadline_s=0.5)
    assert samples(c1, "tool0") == samples(c0, "tool0") and samples(c0, "tool1") == samples(c1, "tool1")  # once each
    assert x0.counters.received == x1.counters.received == 10
    x0.check_integrity(), x1.check_integrity()


def test_an_exchange_nobody_closed_never_blocks_its_process():
    """An exchange left to the garbage collector (a test that failed, a scheduler that dropped it)
    in a reference cycle: its context used to block the process in ``term`` for good, because the
    sockets were collected before the context and so could no longer be closed."""
    script = textwrap.dedent(
        """
        import gc, sys
        from sglang_continuum.core.stats_exchange import StatsExchange

        class Owner:
            pass

        owner = Owner()
        owner.exchange = StatsExchange(sys.argv[1], [sys.argv[2]], interval_s=0.0)
        owner.record, owner.exchange.owner = owner.exchange.record, owner  # a cycle
        del owner
        gc.collect()
        print("collected", flush=True)
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, endpoint(), endpoint()], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung collecting an unclosed exchange")
    assert done.returncode == 0 and done.stdout.strip() == "collected", done.stderr


def _rogue_delivers(x, messages, until, deadline_s=DEADLINE_S):
    """A listed peer (a PUB at the exchange's peer endpoint) sends ``messages`` until ``until(got)``
    holds for what ``x.poll`` handed out; returns that list."""
    got = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for msg in messages:
            x.rogue.send(msg)
        got.extend(x.poll(time.monotonic()))
        if until(got):
            return got
        time.sleep(0.02)
    return got


@pytest.fixture
def peer_of(closing):
    """An exchange whose one listed peer endpoint is a bare PUB the test writes to (``x.rogue``)."""
    made = []

    def make(**kw):
        ex, er = endpoint(), endpoint()
        x = StatsExchange(ex, [er], interval_s=0.0, **kw)
        closing(x)
        x.rogue = zmq.Context.instance().socket(zmq.PUB)
        x.rogue.setsockopt(zmq.LINGER, 0)
        x.rogue.bind(er)
        made.append(x.rogue)
        return x

    yield make
    for sock in made:
        sock.close(linger=0)


def test_peer_samples_out_of_bounds_or_with_names_no_client_could_send_are_refused(peer_of):
    x = peer_of()
    bad = [
        [1, DURATION, "huge", 1e308],  # would make every sum inf, then nan
        [2, DURATION, "long", MAX_DURATION_S * 1.01],
        [3, DURATION, "bidi\u202eevil", 1.0],  # a bidi override: not printable
        [4, DURATION, "tab\there", 1.0],
        [5, DURATION, "x" * (MAX_TOOL_NAME_LEN + 1), 1.0],
        [6, DURATION, "   ", 1.0],
        [7, OUTCOME, "bash", 0.5],
        [8, DURATION, "bool", True],
    ]
    good = [9, DURATION, "bash", MAX_DURATION_S]  # the bound itself is a duration
    msg = orjson.dumps({"o": "r", "s": [*bad, good]})
    got = _rogue_delivers(x, [msg], lambda got: bool(got))
    assert got == [(DURATION, "bash", MAX_DURATION_S)] and x.counters.malformed == len(bad)
    stats = ToolStats()
    stats.merge(got)
    stats.check_integrity()
    x.check_integrity()


def test_a_message_with_keys_the_protocol_does_not_have_is_refused_whole(peer_of):
    x = peer_of()
    odd = orjson.dumps({"o": "r", "s": [[1, DURATION, "odd", 1.0]], "pad": "x" * 1000})
    good = orjson.dumps({"o": "r", "s": [[2, DURATION, "good", 1.0]]})
    got = _rogue_delivers(x, [odd, good], lambda got: bool(got))
    assert [tool for _, tool, _ in got] == ["good"] and x.counters.malformed >= 1
    x.check_integrity()


def test_the_default_message_bound_is_what_the_protocol_needs_and_a_worker_never_exceeds_it(closing):
    """64 KB: 256 samples of 128-character ASCII names fit in one message; names of 128 emoji (4
    bytes each) would not, so the publisher splits, and the peer still gets every sample."""
    full = orjson.dumps({"o": "0" * 16, "f": 1, "h": 2**40, "s": [[2**40, DURATION, "x" * 128, 1 / 3]] * 256})
    assert len(full) <= MAX_MESSAGE_BYTES < 2 * len(full)
    ea, eb = endpoint(), endpoint()
    a, xa = worker(ea, [eb])
    b, xb = worker(eb, [ea])
    closing(xa), closing(xb)
    wide = "\U0001f600" * MAX_TOOL_NAME_LEN
    for i in range(MAX_SAMPLES_PER_MESSAGE):
        xa.record(DURATION, wide, float(i))
    assert pump([(a, xa), (b, xb)], lambda: len(samples(b, wide)) == MAX_SAMPLES_PER_MESSAGE)
    assert xb.counters.malformed == 0 and xa.counters.dropped == 0


def test_a_poll_parses_for_a_bounded_time_and_leaves_the_rest_queued(peer_of):
    ticks = iter(range(10**9))  # every reading of the clock is a second later: each message is over budget
    x = peer_of(timer=lambda: float(next(ticks)), max_messages_per_poll=64)
    hello = orjson.dumps({"o": "r", "s": [[1, DURATION, "hello", 1.0]]})
    assert _rogue_delivers(x, [hello], lambda got: bool(got))  # connected
    burst = [orjson.dumps({"o": "r", "s": [[seq, DURATION, "burst", 1.0]]}) for seq in range(2, 12)]
    for msg in burst:
        x.rogue.send(msg)
    time.sleep(0.3)  # let the burst reach the exchange's queue (not asserted on)
    taken = []
    end = time.monotonic() + DEADLINE_S
    while sum(taken) < len(burst) and time.monotonic() < end:
        before = x.counters.received + x.counters.malformed
        x.poll(time.monotonic())
        taken.append(x.counters.received + x.counters.malformed - before)
    assert sum(taken) == len(burst) and max(taken) == 1, taken  # one message per poll: the budget


def test_a_poll_reads_a_bounded_number_of_bytes(peer_of):
    x = peer_of(max_poll_bytes=1, max_messages_per_poll=64)
    hello = orjson.dumps({"o": "r", "s": [[1, DURATION, "hello", 1.0]]})
    assert _rogue_delivers(x, [hello], lambda got: bool(got))
    for seq in range(2, 12):
        x.rogue.send(orjson.dumps({"o": "r", "s": [[seq, DURATION, "burst", 1.0]]}))
    time.sleep(0.3)  # let the burst reach the exchange's queue (not asserted on)
    taken = []
    end = time.monotonic() + DEADLINE_S
    while sum(taken) < 10 and time.monotonic() < end:
        before = x.counters.received
        x.poll(time.monotonic())
        taken.append(x.counters.received - before)
    assert sum(taken) == 10 and max(taken) == 1, taken


@pytest.mark.parametrize("where", ["recv", "send", "poll"])
def test_a_zmq_error_turns_the_exchange_off_once_and_never_reaches_the_caller(closing, monkeypatch, caplog, where):
    ea, eb = endpoint(), endpoint()
    a, xa = worker(ea, [eb])
    closing(xa)
    run_program(a, "p0", "bash", 1.0)  # something to publish

    def broken(*args, **kwargs):
        raise zmq.ZMQError(errno.EFAULT)

    monkeypatch.setattr(zmq.Poller if where == "poll" else zmq.Socket, where, broken)
    for i in range(3):
        assert xa.poll(time.monotonic() + i) == []  # nothing raised into the scheduler loop
    monkeypatch.undo()
    for i in range(3):
        run_program(a, f"p{i + 1}", "bash", 2.0)  # local statistics go on
        assert xa.poll(time.monotonic() + 10 + i) == []
    assert xa.counters.errors == 1 and xa.peers_alive(time.monotonic()) == 0
    assert len([r for r in caplog.records if "shared tool statistics are off" in r.getMessage()]) == 1
    assert len(samples(a, "bash")) == 4
    xa.check_integrity()
    a.check_integrity()


def test_a_socket_closed_under_the_exchange_is_contained(closing, caplog):
    ea, eb = endpoint(), endpoint()
    a, xa = worker(ea, [eb])
    closing(xa)
    xa.poll(time.monotonic())
    for sock in xa._owned:  # the context's sockets, broken from outside
        sock.close(linger=0)
    assert xa.poll(time.monotonic() + 1) == [] and xa.poll(time.monotonic() + 2) == []
    assert xa.counters.errors == 1
    xa.check_integrity()


def test_ipv6_loopback_endpoints_share_and_an_ipv6_wildcard_reaches_its_siblings_on_the_ipv6_loopback(closing):
    """``tcp://[::1]`` is local like ``127.0.0.1`` (no keys needed), and binds: zmq refuses an
    IPv6 address on a socket without its IPV6 option ("No such device")."""
    from sglang_continuum.core.stats_endpoints import SIBLINGS, connectable, links

    assert connectable("tcp://[::]:5701") == "tcp://[::1]:5701"
    assert links("tcp://[::]:5701", [], True, 0, 2, 8) == [("tcp://[::1]:5702", SIBLINGS, False)]
    pa, pb = free_port(), free_port()
    a = worker(f"tcp://[::1]:{pa}", [f"tcp://[::1]:{pb}"])
    b = worker(f"tcp://[::1]:{pb}", [f"tcp://[::1]:{pa}"])
    closing(a[1]), closing(b[1])
    for i in range(5):
        run_program(a[0], f"p{i}", "search", 2.0 + i)
    assert pump([a, b], lambda: len(samples(b[0], "search")) == 5)
    assert a[1].counters.sent >= 5 and a[1].counters.errors == b[1].counters.errors == 0


def test_an_ipc_endpoint_is_connectable_by_the_servers_own_user_only(closing, tmp_path):
    """Without keys an ipc endpoint is trusted like a peer: its socket file is the server user's
    alone (0600), whatever the umask; other users' processes cannot connect to it."""
    import os
    import stat as st

    path = tmp_path / "stats"
    old = os.umask(0o000)
    try:
        _, exchange = worker(f"ipc://{path}", [])
    finally:
        os.umask(old)
    closing(exchange)
    assert st.S_IMODE(os.stat(path).st_mode) == 0o600
