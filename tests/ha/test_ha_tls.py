"""TLS between brokers (`ha.tls`): peers replicate and fail over over TLS, each broker's peer listener takes
only clients with a certificate from the cluster's CA, and a peer with another CA's certificate is refused,
with a log line on both sides saying why."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ha_harness import HA_USER, AdminClient, AdminError, HaCluster, Load, wait_for
from haqueue.config import TlsConfig
from tls_certs import CertificateAuthority

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, rogue = CertificateAuthority(d, "cluster-ca"), CertificateAuthority(d, "rogue-ca")
    return SimpleNamespace(ca=ca, rogue=rogue, admin=ca.issue("admin"),
                           brokers=[ca.issue(f"b{i}") for i in range(3)], impostor=rogue.issue("b2"))


def tls_cluster(ha_cluster, pki, **kw) -> HaCluster:
    """Every broker with its own certificate from the cluster's CA; the tests' admin calls with another."""
    c = ha_cluster(ha_extra={"tls": pki.admin.config()}, **kw)
    for b, certificate in zip(c.brokers, pki.brokers):
        b.config["ha"]["tls"] = certificate.config()
    return c


def test_cluster_with_ha_tls_replicates_and_fails_over(ha_cluster, pki):
    # each broker also has a plain listener for clients beside its peer listener
    c = tls_cluster(ha_cluster, pki, extra={"listen": ["127.0.0.1:0", "127.0.0.1:0"]})
    p = c.start_cluster()
    load = Load(c.public, "tls.load").start()
    try:
        wait_for(lambda: load.confirmed_count() >= 200 and load.received_count() >= 50, 20,
                 message="traffic before the failover")
        c.kill(p)
        new = wait_for(lambda: c.best_backup(exclude=[p]), 10, message="a ready backup")
        c.promote(new)
        base = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= base + 200, 30, message="200 confirmed after the failover")
        p.start()  # back as a backup of the new primary, over TLS
        c.wait_ready(p)
        load.stop_producer()
        wanted = set(load.confirmed)
        wait_for(lambda: wanted <= set(load.received), 20, message=f"every confirmed message received "
                                                                     f"({load.report()})")
    finally:
        load.stop()
    report = load.report()
    assert report["lost"] == [], report
    assert {x["name"] for x in c.status(new)["backups"] if x["state"] == "ready"} == \
        {b.name for b in c.brokers if b is not new}
    done = c.cli(new, "ha", "status")  # haqueue admin --tls-ca/--tls-cert/--tls-key
    assert done.returncode == 0 and '"role": "primary"' in done.stdout, done.stderr
    # the peer listener takes no one without a certificate, even with the ha password
    with pytest.raises(AdminError):
        AdminClient(new.address, 3.0, HA_USER, c.password).close()
    # and the ha password on the clients' listener does not make a peer: a backup refuses it as a client
    backup = next(b for b in c.brokers if b is not new)
    with pytest.raises(AdminError) as e:
        with AdminClient(backup.addresses[1], 3.0, HA_USER, c.password) as client:
            client.request("READ", "ha")
    assert "is a backup" in str(e.value), str(e.value)


def test_peer_with_a_certificate_from_another_ca_refused(ha_cluster, pki):
    c = tls_cluster(ha_cluster, pki)
    b0, b1, b2 = c.brokers
    # b2 trusts the cluster's CA but presents a certificate from another: the others must refuse it
    b2.config["ha"]["tls"] = pki.impostor.config(ca_file=pki.ca.ca_file)
    c.start(0, 1)
    c.promote(b0)
    c.wait_ready(b1)
    b2.start()
    wait_for(lambda: "refused: TLS handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED]" in b0.log(), 15,
             message="b0 logging the impostor's refusal")
    wait_for(lambda: f"connection to {b0.address}: TLS error: [SSL: TLSV1_ALERT_UNKNOWN_CA]" in b2.log(), 15,
             message="b2 logging why b0 refused it")
    # b2 never follows: reach it with a certificate it trusts, checking its own against the rogue CA
    as_admin = TlsConfig(pki.admin.cert_file, pki.admin.key_file, pki.rogue.ca_file)
    with AdminClient(b2.address, 5.0, HA_USER, c.password, as_admin) as client:
        status = client.request("READ", "ha")[2]
    assert status["role"] == "backup" and status["state"] == "joining" and status["primary"] is None, status
    assert [x["name"] for x in c.status(b0)["backups"]] == ["b1"]
    # an admin with the impostor's certificate is refused too
    with pytest.raises(AdminError):
        AdminClient(b0.address, 3.0, HA_USER, c.password, TlsConfig(**pki.impostor.config(pki.ca.ca_file))).close()
    assert b0.running and b2.running
