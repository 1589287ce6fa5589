"""Connections: heartbeats, SASL, TLS, per-listener frame sizes, shutdown on SIGTERM."""
from __future__ import annotations

import signal
import subprocess

import pytest
from proton import ConnectionException, ProtonException

from clients import Client, RawAmqp, bodies, client_ssl_domain, make_messages
from harness import can_connect, split_address

pytestmark = pytest.mark.timeout(60)


# ---- heartbeats ---------------------------------------------------------------------------

def test_idle_client_gets_heartbeats(broker):
    """The client asks for frames every 1 s at least; idle for 3 s it must still be open."""
    with Client(broker, heartbeat=1) as c:
        assert c.transport.idle_timeout == 1
        c.idle(3.0)  # raises if the transport closed (proton: local-idle-timeout expired)
        assert not c.conn.disconnected
        c.send("q.hb", ["still here"])
        assert bodies(c.receiver("q.hb").receive_n(1)) == ["still here"]


def test_broker_advertises_its_idle_timeout(broker_factory):
    b = broker_factory(limits={"idle_timeout": 2})
    with RawAmqp(b.host, b.port) as raw:
        raw.open()
        raw.wait_open()
        assert 0 < raw.transport.remote_idle_timeout <= 2.0, raw.transport.remote_idle_timeout


def test_broker_closes_a_silent_connection(broker_factory):
    b = broker_factory(limits={"idle_timeout": 1})
    with RawAmqp(b.host, b.port) as raw:
        raw.open()
        raw.wait_open()
        # from now on the client sends nothing at all
        assert raw.read_until_eof(timeout=15), "the broker kept a silent connection open"
        assert b"local-idle-timeout expired" in raw.received, raw.received  # closed for its silence, saying so
    with Client(b) as c:  # others unaffected
        c.roundtrip()


# ---- SASL ---------------------------------------------------------------------------------

USERS = {"alice": "secret", "bob": "hunter2"}


@pytest.fixture
def sasl_required(broker_factory):
    return broker_factory(users=USERS, anonymous=False,
                          listen=[{"address": "127.0.0.1:0", "sasl": "required"}])


def plain(user: str, password: str) -> dict:
    return {"user": user, "password": password, "allowed_mechs": "PLAIN", "allow_insecure_mechs": True}


def test_sasl_plain_right_password(sasl_required):
    with Client(sasl_required, **plain("alice", "secret")) as c:
        c.send("q.sasl", ["authenticated"])
        assert bodies(c.receiver("q.sasl").receive_n(1)) == ["authenticated"]


def test_sasl_plain_wrong_password_refused(sasl_required):
    with pytest.raises(ConnectionException) as e:
        Client(sasl_required, **plain("alice", "wrong"))
    # the broker still serves the right user
    with Client(sasl_required, **plain("bob", "hunter2")) as c:
        c.roundtrip()
    # the client learns why: an authentication failure, not a broken connection
    assert "amqp:unauthorized-access" in str(e.value), str(e.value)


def test_sasl_unknown_user_refused(sasl_required):
    with pytest.raises(ConnectionException):
        Client(sasl_required, **plain("mallory", "secret"))


def test_sasl_anonymous_refused_when_required(sasl_required):
    with pytest.raises(ConnectionException):
        Client(sasl_required, allowed_mechs="ANONYMOUS")


def test_no_sasl_layer_refused_when_required(sasl_required):
    with pytest.raises((ConnectionException, ProtonException)):
        c = Client(sasl_required, sasl_enabled=False)
        try:
            c.roundtrip()  # some brokers accept the header and close at the first frame
        finally:
            c.close()


@pytest.fixture
def sasl_optional(broker_factory):
    return broker_factory(users=USERS, anonymous=True,
                          listen=[{"address": "127.0.0.1:0", "sasl": "optional"}])


def test_no_sasl_layer_accepted_when_optional(sasl_optional):
    with Client(sasl_optional, sasl_enabled=False) as c:
        c.send("q.nosasl", ["plain amqp"])
        assert bodies(c.receiver("q.nosasl").receive_n(1)) == ["plain amqp"]


def test_sasl_anonymous_accepted_when_optional(sasl_optional):
    with Client(sasl_optional, allowed_mechs="ANONYMOUS") as c:
        c.roundtrip()


def test_sasl_plain_accepted_when_optional(sasl_optional):
    with Client(sasl_optional, **plain("alice", "secret")) as c:
        c.roundtrip()
    with pytest.raises(ConnectionException):
        Client(sasl_optional, **plain("alice", "nope"))


def test_anonymous_false_refuses_anonymous_on_optional_listener(broker_factory):
    b = broker_factory(users=USERS, anonymous=False)
    with pytest.raises(ConnectionException):
        Client(b, allowed_mechs="ANONYMOUS")
    with Client(b, **plain("alice", "secret")) as c:
        c.roundtrip()


def test_sasl_policy_is_per_listener(broker_factory):
    b = broker_factory(users=USERS, anonymous=True,
                       listen=[{"address": "127.0.0.1:0", "sasl": "required"},
                               {"address": "127.0.0.1:0", "sasl": "optional"}])
    with pytest.raises((ConnectionException, ProtonException)):
        c = Client(b, listener=0, sasl_enabled=False)
        try:
            c.roundtrip()
        finally:
            c.close()
    with Client(b, listener=0, **plain("alice", "secret")) as c:
        c.roundtrip()
    with Client(b, listener=1, sasl_enabled=False) as c:
        c.roundtrip()


# ---- TLS ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert), "-days", "2"],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


@pytest.fixture
def tls_broker(broker_factory, certificate):
    cert, key = certificate
    return broker_factory(tls={"cert_file": cert, "key_file": key},
                          listen=[{"address": "127.0.0.1:0", "tls": True}, "127.0.0.1:0"])


def test_tls_messages_flow(tls_broker, certificate):
    cert, _ = certificate
    domain = client_ssl_domain(cert, verify_hostname=False)
    url = f"amqps://{tls_broker.addresses[0]}"
    with Client(url, ssl_domain=domain) as c:
        assert c.transport is not None
        c.send("q.tls", make_messages(20, prefix="tls"))
        assert bodies(c.receiver("q.tls").receive_n(20)) == [f"tls-{i}" for i in range(20)]
    with Client(tls_broker, listener=1) as plain_client:  # the plain listener beside it
        assert plain_client.queue_depth("q.tls") == 0


def test_tls_with_hostname_verification(tls_broker, certificate):
    cert, _ = certificate
    domain = client_ssl_domain(cert, verify_hostname=True)
    with Client(f"amqps://{tls_broker.addresses[0]}", ssl_domain=domain, virtual_host="localhost") as c:
        c.roundtrip()


def test_sasl_plain_over_tls(broker_factory, certificate):
    cert, key = certificate
    b = broker_factory(tls={"cert_file": cert, "key_file": key}, users=USERS, anonymous=False,
                       listen=[{"address": "127.0.0.1:0", "tls": True, "sasl": "required"}])
    domain = client_ssl_domain(cert, verify_hostname=False)
    url = f"amqps://{b.address}"
    with Client(url, ssl_domain=domain, user="alice", password="secret", allowed_mechs="PLAIN",
                allow_insecure_mechs=False) as c:
        c.send("q.tls.sasl", ["secure"])
        assert bodies(c.receiver("q.tls.sasl").receive_n(1)) == ["secure"]
    with pytest.raises(ConnectionException):
        Client(url, ssl_domain=client_ssl_domain(cert, verify_hostname=False), user="alice",
               password="bad", allowed_mechs="PLAIN")


def test_plain_client_on_tls_listener_fails(tls_broker):
    with pytest.raises((ConnectionException, ProtonException)):
        c = Client(tls_broker, listener=0, timeout=5)
        try:
            c.roundtrip()
        finally:
            c.close()
    with Client(tls_broker, listener=1) as c:
        c.roundtrip()


# ---- frame sizes --------------------------------------------------------------------------

def test_max_frame_size_per_listener(broker_factory):
    b = broker_factory(listen=[{"address": "127.0.0.1:0", "max_frame_size": 4096},
                               {"address": "127.0.0.1:0", "max_frame_size": 1048576}])
    with Client(b, listener=0) as small, Client(b, listener=1) as large:
        assert small.remote_max_frame_size == 4096
        assert large.remote_max_frame_size == 1048576
        payload = b"z" * 50_000
        small.send("q.frames", [payload])
        [got] = large.receiver("q.frames").receive_n(1)
        assert got.body == payload


def test_default_max_frame_size_from_limits(broker_factory):
    b = broker_factory(limits={"max_frame_size": 16384})
    with Client(b) as c:
        assert c.remote_max_frame_size == 16384


# ---- shutdown -----------------------------------------------------------------------------

def test_sigterm_exits_zero_promptly(broker):
    with Client(broker) as c:
        c.send("q.term", ["x"])
        broker.signal(signal.SIGTERM)
        assert broker.wait(timeout=10) == 0, broker.log()
    host, port = split_address(broker.address)
    assert not can_connect(host, port)


def test_sigterm_with_idle_clients_connected(broker):
    clients = [Client(broker) for _ in range(3)]
    try:
        clients[0].receiver("q.waiting", credit=10)
        broker.signal(signal.SIGTERM)
        assert broker.wait(timeout=10) == 0
    finally:
        for c in clients:
            try:
                c.close()
            except Exception:
                pass


def test_sigint_exits_zero(broker):
    broker.signal(signal.SIGINT)
    assert broker.wait(timeout=10) == 0
