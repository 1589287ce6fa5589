"""Client certificates: a listener with `require_client_cert` lets in only TLS clients whose certificate
its CA signed, and SASL EXTERNAL logs such a client in as the certificate's subject (CN)."""
from __future__ import annotations

import socket
import ssl
import struct
from types import SimpleNamespace

import pytest
from proton import (ConnectionException, Data, Described, ProtonException, SSLDomain, symbol, ulong)

from clients import Client, bodies
from tls_certs import Certificate, CertificateAuthority

pytestmark = pytest.mark.timeout(60)

SASL_HEADER = b"AMQP\x03\x01\x00\x00"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = CertificateAuthority(d, "clients-ca"), CertificateAuthority(d, "other-ca")
    return SimpleNamespace(ca=ca, server=ca.issue("localhost"), alice=ca.issue("alice"), bob=ca.issue("bob"),
                           forged_alice=other.issue("alice"))


def domain(pki, certificate: Certificate | None) -> SSLDomain:
    """A client's TLS: it checks the broker against the CA and presents `certificate` if any."""
    d = SSLDomain(SSLDomain.MODE_CLIENT)
    d.set_trusted_ca_db(pki.ca.ca_file)
    d.set_peer_authentication(SSLDomain.VERIFY_PEER)
    if certificate is not None:
        d.set_credentials(certificate.cert_file, certificate.key_file, None)
    return d


def external(pki, broker, certificate: Certificate | None, **kw) -> Client:
    return Client(f"amqps://{broker.address}", ssl_domain=domain(pki, certificate), allowed_mechs="EXTERNAL", **kw)


@pytest.fixture
def cert_broker(broker_factory, pki):
    """Client certificates required; no anonymous access, no password users; one connection per user."""
    # A certificate's subject is a user: its permissions are those of the user of that name (no password:
    # it logs in only with its certificate); a subject with no such user may do nothing.
    everything = {"allow": {"send": ["*"], "receive": ["*"], "admin": True}}
    return broker_factory(tls=pki.server.config(), anonymous=False, limits={"max_connections_per_user": 1},
                          users={"alice": everything, "bob": everything},
                          listen=[{"address": "127.0.0.1:0", "tls": True, "require_client_cert": True,
                                   "sasl": "required"}])


def test_external_logs_in_as_the_certificates_subject(cert_broker, pki):
    with external(pki, cert_broker, pki.alice) as alice:
        alice.send("q.cert", ["from alice"])
        # alice's second connection is over her limit of one: the broker took the certificate's CN as the user
        with pytest.raises(ConnectionException) as e:
            external(pki, cert_broker, pki.alice).close()
        assert "amqp:resource-limit-exceeded" in str(e.value), str(e.value)
        assert "user 'alice'" in str(e.value) and "max_connections_per_user 1" in str(e.value), str(e.value)
        with external(pki, cert_broker, pki.bob) as bob:  # another subject, another user
            assert bodies(bob.receiver("q.cert").receive_n(1)) == ["from alice"]


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_client_without_a_certificate_from_the_ca_refused(cert_broker, pki, who):
    certificate = None if who == "no certificate" else pki.forged_alice
    with pytest.raises((ConnectionException, ProtonException)):
        c = external(pki, cert_broker, certificate, timeout=5)
        try:
            c.roundtrip()
        finally:
            c.close()
    log = cert_broker.log()
    assert "refused: TLS handshake failed" in log, log[-2000:]
    with external(pki, cert_broker, pki.bob) as c:  # the broker still serves others
        c.roundtrip()


def test_external_offered_only_to_a_client_with_a_verified_certificate(broker_factory, pki):
    """Certificates optional (a ca_file, no require_client_cert): one with a certificate may use EXTERNAL,
    one without logs in as before (PLAIN here) and cannot pick EXTERNAL."""
    b = broker_factory(tls=pki.server.config(), anonymous=False,
                       users={"carol": "pw", "alice": {"allow": {"admin": True}}},
                       listen=[{"address": "127.0.0.1:0", "tls": True, "sasl": "required"}])
    with external(pki, b, pki.alice) as c:
        c.roundtrip()
    with Client(f"amqps://{b.address}", ssl_domain=domain(pki, None), allowed_mechs="PLAIN", user="carol",
                password="pw") as c:
        c.roundtrip()
    with pytest.raises(ConnectionException):
        external(pki, b, None, timeout=5).close()


def _sasl_init(mechanism: str, response: bytes) -> bytes:
    data = Data()
    data.put_object(Described(ulong(0x41), [symbol(mechanism), response]))
    body = bytes(data.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def _sasl_outcome_code(tls: ssl.SSLSocket) -> int:
    """Read the broker's SASL header, mechanisms and outcome; the outcome's code (0 ok, 1 auth failed)."""
    received = b""
    while True:
        chunk = tls.recv(4096)
        if not chunk:
            raise AssertionError(f"connection closed before the SASL outcome; got {received!r}")
        received += chunk
        frames, offset = [], 8
        while offset + 8 <= len(received):
            size = struct.unpack_from(">I", received, offset)[0]
            if offset + size > len(received):
                break
            frames.append(received[offset + 8:offset + size])
            offset += size
        for body in frames:
            d = Data()
            d.decode(body)
            d.rewind()
            d.next()
            frame = d.get_object()
            if frame.descriptor == 0x44:
                return int(frame.value[0])


def test_external_cannot_log_in_as_another_user(cert_broker, pki):
    """EXTERNAL's response may name the identity wanted: only the certificate's own is granted."""
    context = ssl.create_default_context(cafile=pki.ca.ca_file)
    context.check_hostname = False
    context.load_cert_chain(pki.alice.cert_file, pki.alice.key_file)
    for wanted, code in ((b"bob", 1), (b"alice", 0)):
        with socket.create_connection((cert_broker.host, cert_broker.port), timeout=10) as raw, \
                context.wrap_socket(raw) as tls:
            tls.sendall(SASL_HEADER + _sasl_init("EXTERNAL", wanted))
            assert _sasl_outcome_code(tls) == code, wanted
    assert "the certificate of 'alice' cannot log in as 'bob'" in cert_broker.log()
