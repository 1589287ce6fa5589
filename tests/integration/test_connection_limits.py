"""Limits a hostile client can hit: a connection that has not opened within `limits.handshake_timeout` is
closed however slowly it is still sending (slow-loris), connections per source address and per user
are capped, and a malformed SASL frame refuses its connection alone. The broker keeps serving others."""
from __future__ import annotations

import re
import socket
import struct
import time

import pytest
from proton import ConnectionException

from clients import AMQP_HEADER, SASL_HEADER, Client, RawAmqp, frame
from harness import wait_for

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


def test_silent_connection_closed_after_handshake_timeout(impatient):
    with socket.create_connection((impatient.host, impatient.port)) as s:
        port = s.getsockname()[1]
        took = closed_by_broker(s, timeout=15)
    assert 0.8 <= took <= 5, took
    assert re.search(rf"connection 127\.0\.0\.1:{port} closed: no AMQP open within 1 s "
                     r"\(limits\.handshake_timeout\); it was still in the protocol header", impatient.log())


@pytest.mark.parametrize("prefix, dribble, stage", [
    (b"", AMQP_HEADER * 10, "the protocol header"),  # a byte at a time, never a whole header in time
    (AMQP_HEADER, frame(b"\x00" * 200), "the open frame"),  # the header, then an open that never ends
    (SASL_HEADER, frame(b"\x00" * 200, frame_type=1), "the SASL exchange"),
], ids=["header", "open", "sasl"])
def test_slow_loris_closed_while_still_sending(impatient, prefix, dribble, stage):
    with Client(impatient) as bystander:
        with socket.create_connection((impatient.host, impatient.port)) as s:
            s.sendall(prefix)
            took = closed_by_broker(s, timeout=15, dribble=dribble)
        assert took <= 5, took
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
