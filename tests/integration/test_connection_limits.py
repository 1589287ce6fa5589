"""Limits a hostile client can hit: a connection that has not opened within `limits.handshake_timeout` is
closed however slowly it is still sending (slow-loris), connections in all, per source address and per user
are capped, sockets beyond the clients' limit and the room kept for peers are closed at once, and a malformed
SASL frame refuses its connection alone. The broker keeps serving others. HA's peers count against no
client limit: a backup replicates more queues than max_links_per_connection and joins while clients fill
max_connections. 10,000 idle clients, each with a link, get in (slow)."""
from __future__ import annotations

import re
import resource
import socket
import struct
import time

import pytest
from proton import ConnectionException, Endpoint

from clients import AMQP_HEADER, SASL_HEADER, Client, RawAmqp, frame
from ha_harness import HA_USER, HaCluster, cluster_factory, connect, send_all, split_address
from harness import rss, wait_for
from many_connections import IdleConnections

from haqueue.broker.connection_limits import PEER_ROOM

pytestmark = pytest.mark.timeout(60)

USERS = {"alice": "secret", "bob": "hunter2"}


def plain(user: str, password: str) -> dict:
    return {"user": user, "password": password, "allowed_mechs": "PLAIN", "allow_insecure_mechs": True}


def closed_by_broker(sock: socket.socket, timeout: float, dribble: bytes = b"", every: float = 0.2) -> float:
    """Send `dribble` a byte every `every` s (then nothing) until the broker closes; seconds it took."""
    started = time.monotonic()
    sock.settimeout(every)
    sent = 0
    while time.monotonic() - started < timeout:
        if sent < len(dribble):
            try:
                sock.sendall(dribble[sent:sent + 1])
            except OSError:
                return time.monotonic() - started
            sent += 1
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started
    raise AssertionError(f"the broker kept the connection open for {timeout} s ({sent} bytes sent)")


@pytest.fixture
def impatient(broker_factory):
    return broker_factory(limits={"handshake_timeout": 1})


@pytest.fixture
def hushed(broker_factory):
    return broker_factory(limits={"handshake_timeout": 1, "idle_timeout": 3})


def test_silent_connection_closed_after_idle_timeout(hushed):
    """Before its first byte a socket is held for idle_timeout, as an open connection that stays silent is, not
    handshake_timeout: that clock starts at the first byte (a Container connects many sockets before it writes
    to any; a reconnect storm's clients are slow, not the broker)."""
    with socket.create_connection((hushed.host, hushed.port)) as s:
        port = s.getsockname()[1]
        took = closed_by_broker(s, timeout=15)
    assert took >= 2, took  # not at handshake_timeout's 1 s
    assert re.search(rf"connection 127\.0\.0\.1:{port} closed: nothing received within 3 s \(limits\.idle_timeout\)",
                     hushed.log())


def test_a_client_silent_past_handshake_timeout_then_opening_is_admitted(hushed):
    raw = RawAmqp(hushed.host, hushed.port)
    try:
        time.sleep(1.5)  # silent past handshake_timeout (1 s), within idle_timeout (3 s): the behaviour under test
        raw.open()
        assert raw.pump(lambda: raw.conn.state & Endpoint.REMOTE_ACTIVE, timeout=10), "the broker did not open"
    finally:
        raw.close()


@pytest.mark.parametrize("prefix, dribble, stage", [
    (b"", AMQP_HEADER * 10, "the protocol header"),  # a byte at a time, never a whole header in time
    (AMQP_HEADER, frame(b"\x00" * 200), "the open frame"),  # the header, then an open that never ends
    (SASL_HEADER, frame(b"\x00" * 200, frame_type=1), "the SASL exchange"),
], ids=["header", "open", "sasl"])
def test_slow_loris_closed_while_still_sending(impatient, prefix, dribble, stage):
    with Client(impatient) as bystander:
        with socket.create_connection((impatient.host, impatient.port)) as s:
            s.sendall(prefix)
            closed_by_broker(s, timeout=15, dribble=dribble)  # each dribble outlasts the 15 s: closed while sending
        assert f"it was still in {stage}" in impatient.log()
        bystander.roundtrip()


def test_opened_connection_outlives_handshake_timeout(impatient):
    with Client(impatient) as c:
        c.idle(2.5)
        c.roundtrip()


def test_max_connections_per_address(broker_factory):
    b = broker_factory(limits={"max_connections_per_address": 3})
    clients = [Client(b) for _ in range(3)]
    try:
        with pytest.raises(ConnectionException) as e:
            Client(b).close()
        assert "amqp:resource-limit-exceeded" in str(e.value), str(e.value)
        assert "too many connections from 127.0.0.1 (limits.max_connections_per_address 3)" in str(e.value)
        clients.pop().close()
        wait_for(lambda: _connects(b), 10, message="room again after a client left")
    finally:
        for c in clients:
            c.close()


def _connects(b) -> bool:
    try:
        with Client(b) as c:
            c.roundtrip()
        return True
    except ConnectionException:
        return False  # the broker has not yet seen the last one go


def test_max_connections_per_user(broker_factory):
    b = broker_factory(users=USERS, limits={"max_connections_per_user": 2})
    clients = [Client(b, **plain("alice", "secret")) for _ in range(2)]
    try:
        with pytest.raises(ConnectionException) as e:
            Client(b, **plain("alice", "secret")).close()
        assert "amqp:resource-limit-exceeded" in str(e.value), str(e.value)
        assert "too many connections for user 'alice' (limits.max_connections_per_user 2)" in str(e.value)
        with Client(b, **plain("bob", "hunter2")) as bob:
            bob.roundtrip()
        anonymous = [Client(b) for _ in range(3)]  # anonymous clients are limited per address only
        for c in anonymous:
            c.close()
        clients.pop().close()
        wait_for(lambda: _connects_as(b, "alice", "secret"), 10, message="alice has room again")
    finally:
        for c in clients:
            c.close()
    assert b.running


def _connects_as(b, user: str, password: str) -> bool:
    try:
        with Client(b, **plain(user, password)) as c:
            c.roundtrip()
        return True
    except ConnectionException:
        return False


@pytest.mark.parametrize("body", [
    b"\xff\xfe\xfd not an AMQP encoding",
    b"\x00\x53\x41\x71\x00\x00\x00\x05",  # sasl-init described as an int, not a list
], ids=["garbage", "int-init"])
def test_malformed_sasl_frame_refuses_that_connection_alone(broker, body):
    with Client(broker) as bystander:
        with socket.create_connection((broker.host, broker.port), timeout=10) as s:
            s.sendall(SASL_HEADER + struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body)
            received = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                received += chunk
        assert received.startswith(SASL_HEADER), received[:16]
        assert received[-1:] in (b"\x01", b"\x02"), received[-16:]  # a sasl-outcome refusing it
        bystander.roundtrip()
    assert broker.running
    with RawAmqp(broker.host, broker.port) as raw:
        raw.open()
        raw.wait_open()


def fill(crowd: IdleConnections, n: int) -> None:
    """Hold `n` connections, retrying those refused while the broker still counts connections just closed."""
    def full() -> bool:
        crowd.open(n - len(crowd))
        return len(crowd) >= n
    wait_for(full, 10, message=f"{n} connections admitted")


def limit_refusal(limit: str, n: int) -> str:
    return f"amqp:resource-limit-exceeded: too many connections (limits.{limit} {n})"


def test_sockets_beyond_the_room_for_peers_are_closed_at_once(broker_factory):
    b = broker_factory(limits={"max_connections": 5, "handshake_timeout": 3})
    with IdleConnections(b.host, b.port) as crowd:
        fill(crowd, 5)
        assert crowd.open(1).refused == {limit_refusal("max_connections", 5): 1}
        silent = [socket.create_connection((b.host, b.port)) for _ in range(PEER_ROOM)]  # handshakes in progress
        try:
            assert _turned_away(b)
            assert crowd.open(1).refused == {"closed by the broker before it answered": 1}
        finally:
            for s in silent:
                s.close()
        assert f"refused: 105 connections open, the most this broker takes (limits.max_connections 5, and " \
               f"{PEER_ROOM} for peers and handshakes)" in b.log()
        wait_for(lambda: crowd.open(1).refused == {limit_refusal("max_connections", 5): 1}, 10,
                 message="room for handshakes again, still none for clients")


def _turned_away(b) -> bool:
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        return s.recv(1) == b""


@pytest.fixture
def ha_cluster(tmp_path):
    yield from cluster_factory(HaCluster, tmp_path)


def test_peers_count_against_no_client_limit(ha_cluster):
    """A backup's peer connection holds a link per replicated queue: 15 over max_links_per_connection 10. It
    rejoins while clients fill max_connections, and the ha user's admin calls and sessions go through."""
    c = ha_cluster(size=2, extra={"limits": {"max_connections": 20, "max_links_per_connection": 10,
                                             "max_sessions_per_connection": 2}})
    p = c.start_cluster()
    backup = c[1]
    queues = [f"lq-{i}" for i in range(15)]
    for q in queues:
        send_all(c.public, q, ["a", "b"])
    c.wait_ready(backup, queues=queues)
    with IdleConnections(*split_address(c.public)) as crowd:
        fill(crowd, 20)
        assert crowd.open(1).refused == {limit_refusal("max_connections", 20): 1}
        c.kill(backup)
        backup.start()
        c.wait_ready(backup, 20, queues=queues)
        c.wait_backups_ready(p, [backup.name])
        depths = {q["name"]: q["depth"] for q in c.request(backup, "QUERY", "queue", user=HA_USER)}
        assert {q: depths.get(q) for q in queues} == {q: 2 for q in queues}
        _peer_sessions_and_links(p.address, c.password, 3, 12)
        assert crowd.open(1).refused == {limit_refusal("max_connections", 20): 1}
    assert "not replicated" not in backup.log()


STORM = 500  # connections opened at once; bench/scale.py --storm measures 10,000, and how long they take


def test_a_storm_of_clients_is_admitted_and_again_after_a_failover(ha_cluster):
    """Clients opening at once, as every client does when its primary fails: each connection of a storm (every one
    opened before any is answered) is admitted; the primary killed, every one is dropped, and the same storm at the
    new primary is admitted whole."""
    c = ha_cluster(size=2)
    p = c.start_cluster()
    with IdleConnections(*split_address(c.public), concurrency=STORM) as crowd:
        opened = crowd.open(STORM)
        assert (opened.admitted, opened.refused) == (STORM, {}), opened
        c.kill(p)
        c.promote(wait_for(lambda: c.best_backup(exclude=[p]), 10, message="a ready backup"))
        wait_for(lambda: len(crowd) == 0, 10, message="every client dropped with the primary")
        opened = crowd.open(STORM)
        assert (opened.admitted, opened.refused) == (STORM, {}), opened


def _peer_sessions_and_links(address: str, password: str, sessions: int, links: int) -> None:
    """As the ha user: more sessions and links than a client may have, all opened."""
    peer = connect(address, user=HA_USER, password=password)
    try:
        opened = [peer.conn.session() for _ in range(sessions)]
        for s in opened:
            s.open()
        peer.wait(lambda: all(s.state & Endpoint.REMOTE_ACTIVE for s in opened), timeout=5, msg="peer sessions")
        for i in range(links):
            peer.create_sender("$management", name=f"peer-{i}")
    finally:
        peer.close()


@pytest.mark.slow
@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 12_000,
                    reason="10,000 connections need more file descriptors than RLIMIT_NOFILE's hard limit allows")
def test_ten_thousand_idle_clients(broker_factory):
    b = broker_factory(limits={"max_connections": 10_000})
    before = rss(b.pid)
    with IdleConnections(b.host, b.port) as crowd:
        opened = crowd.open(10_000)
        assert (opened.admitted, opened.refused) == (10_000, {}), opened
        assert crowd.open(1).refused == {limit_refusal("max_connections", 10_000): 1}
        print(f"\n10,000 idle clients with a link each: opened in {opened.seconds:.1f} s, "
              f"{(rss(b.pid) - before) / 10_000 / 1024:.1f} KiB of the broker's RSS each")
    assert "client connections: at most limits.max_connections 10000" in b.log()
