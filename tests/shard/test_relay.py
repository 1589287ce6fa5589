"""Step 3 of design/sharding.md: a client attached to a process that does not serve its queue is relayed to
the owning shard's primary: publishes confirmed only once the owner confirmed them, deliveries, outcomes,
credit and drain passed through, and a failover of the owner followed without losing a confirmed message.

In the 2-node, 2-shard cluster, node n1 hosts shard 0's preferred primary and a backup of shard 1, n2 the
reverse: a client at n1's client address (either process, as the kernel picks) is relayed for shard 1's
queues, at n2's for shard 0's."""
from __future__ import annotations

import base64
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))

from clients import Client  # noqa: E402
from proton import Message, symbol  # noqa: E402
from proton.utils import LinkDetached  # noqa: E402
from proton.reactor import LinkOption, Selector  # noqa: E402

from ha_harness import HA_USER, Load, browse, connect, receive, send_all  # noqa: E402
from haqueue.shard.relayed_links import RELAYED_FOR  # noqa: E402
from shard_harness import no_copy, owned_by  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_a_stock_proton_client_sends_and_receives_through_the_relay(two_shards) -> None:
    c = two_shards
    queue = owned_by(1, "relay.proton")
    entry = c.client_address("n1")
    sent = [f"m{i}" for i in range(300)]
    send_all(entry, queue, sent)  # returns once every publish is confirmed
    primary, backup = c.shard_processes(1)
    assert c.depth(primary, queue) == 300  # confirmed: on the owner's primary...
    c.wait_depth(backup, queue, 300)  # ...and replicated to its backup
    for b in c.shard_processes(0):  # never made where it was relayed from
        assert no_copy(c.queues(b).get(queue)), c.queues(b).get(queue)
    assert [m.body for m in receive(entry, queue, 300)] == sent
    c.wait_depth(primary, queue, 0)  # the client's accepts reached the owner


def test_a_rhea_client_sends_and_receives_through_the_relay(shard_cluster) -> None:
    interop = pytest.importorskip("test_interop_rhea")
    from typed import bare_message
    c = shard_cluster(size=2, shards=2, replicas=2)
    c.start_shards()
    queue = owned_by(0, "relay.rhea")
    host, port = c.client_address("n2").split(":")
    expected = interop.specs(queue) * 20
    out = interop.node("send.js", {"host": host, "port": int(port), "address": queue, "messages": expected,
                                   "timeout_ms": 30000})
    assert out["returncode"] == 0, out
    assert [s["state"] for s in out["sent"]] == ["accepted"] * len(expected)
    assert c.depth(c.shard_processes(0)[0], queue) == len(expected)
    got = interop.node("receive.js", {"host": host, "port": int(port), "address": queue, "count": len(expected),
                                      "timeout_ms": 30000, "quiet_ms": 300})
    assert got["returncode"] == 0, got
    assert len(got["received"]) == len(expected) and got["extra"] == 0
    assert [bare_message(base64.b64decode(r["raw"])) for r in got["received"]] == \
        [bare_message(base64.b64decode(s["raw"])) for s in out["sent"]]  # byte for byte, in order
    c.wait_depth(c.shard_processes(0)[0], queue, 0)


def test_a_drain_passes_through_the_relay(two_shards) -> None:
    c = two_shards
    queue = owned_by(1, "relay.drain")
    entry = c.client_address("n1")
    send_all(entry, queue, ["d-0", "d-1"])
    with Client(entry) as client:
        r = client.receiver(queue, credit=0)
        got = r.drain(5)
        assert [g.body for g in got] == ["d-0", "d-1"]
        assert r.credit == 0
        for g in got:
            r.accept(g)
        assert r.drain(5) == []  # an empty queue: the owner answers the drain at once, and so does the relay
        assert r.credit == 0
        send_all(entry, queue, ["after"])  # and the link still works afterwards
        assert [g.body for g in r.receive_n(1)] == ["after"]
    c.wait_depth(c.shard_processes(1)[0], queue, 0)


def test_a_selector_and_a_browser_pass_through_the_relay(two_shards) -> None:
    c = two_shards
    queue = owned_by(1, "relay.select")
    entry = c.client_address("n1")
    send_all(entry, queue, [Message(body=i, durable=True, properties={"colour": "red" if i % 2 else "green"})
                            for i in range(10)])
    conn = connect(entry)
    try:
        r = conn.create_receiver(queue, credit=10, options=Selector("colour = 'red'"))
        reds = []
        for _ in range(5):
            reds.append(r.receive(timeout=10).body)
            r.accept()
    finally:
        conn.close()
    assert reds == [1, 3, 5, 7, 9]  # the owner applied the client's selector
    primary = c.shard_processes(1)[0]
    c.wait_depth(primary, queue, 5)
    assert [m.body for m in browse(entry, queue, 5)] == [0, 2, 4, 6, 8]
    assert c.depth(primary, queue) == 5  # browsed, not taken


def test_an_owners_rejection_reaches_the_client_with_its_reason(two_shards) -> None:
    c = two_shards
    queue = owned_by(1, "relay.full")
    c.request(c.publics[1], "CREATE", "queue", queue, {"max_depth": 1, "overflow": "reject-publish"})
    with Client(c.client_address("n1")) as client:
        kept, refused = client.send(queue, ["fits", "does not fit"], check=False)
    assert kept.remote_state == kept.ACCEPTED
    assert refused.remote_state == refused.REJECTED
    assert refused.remote.condition.name == "amqp:resource-limit-exceeded"
    assert queue in refused.remote.condition.description  # the owner's words, passed on by the relay


def test_a_failover_of_the_owner_loses_no_confirmed_relayed_message(two_shards) -> None:
    c = two_shards
    queue = owned_by(1, "relay.failover")
    old, new = c.shard_processes(1)  # shard 1: primary on n2, backup on n1
    load = Load(c.client_address("n1"), queue)  # relayed by n1's processes whichever serves it
    _, report = load.across(lambda: (c.kill(old), c.promote(new)))
    assert report["lost"] == [], report
    assert report["errors"] == 0, report  # the relay kept the client's links: a pause, not an error
    assert c.status(new)["role"] == "primary"


def test_a_relayed_link_outlasts_a_failover_longer_than_the_backup_timeout(shard_cluster) -> None:
    """ha.backup_timeout 1 s, shard.relay_timeout 30 s: shard 1's primary killed, its backup promoted 3 s later.
    The relayed publisher's send during the outage is confirmed by the new primary, and the relayed consumer
    gets it, on the same links: the relay waited for the shard's primary as long as shard.relay_timeout."""
    c = shard_cluster(size=2, shards=2, replicas=2, backup_timeout=1.0, relay_timeout=30.0)
    c.start_shards()
    queue = owned_by(1, "relay.patient")
    old, new = c.shard_processes(1)
    conn = connect(c.publics[0])  # shard 0's primary alone: every link to shard 1's queue is relayed
    try:
        sender = conn.create_sender(queue)
        sender.send(Message(body="before"), timeout=10)
        assert [m.body for m in receive(c.publics[0], queue, 1)] == ["before"]
        c.wait_depth(new, queue, 0)  # accepted at the owner and its backup: not delivered again after
        receiver = conn.create_receiver(queue, credit=10)
        outage = 3.0  # the failover's length, the point of the test: three times ha.backup_timeout
        promotion = threading.Timer(outage, c.promote, [new])
        c.kill(old)
        killed = time.monotonic()
        promotion.start()
        try:
            sender.send(Message(body="during"), timeout=30)  # held by the relay until the new primary confirms
        finally:
            promotion.join()
        assert time.monotonic() - killed >= outage
        assert receiver.receive(timeout=10).body == "during"
        receiver.accept()
    finally:
        conn.close()
    assert c.status(new)["role"] == "primary"
    c.wait_depth(new, queue, 0)


def test_without_a_primary_a_relayed_link_is_detached_after_the_relay_timeout(two_shards) -> None:
    c = two_shards  # shard.relay_timeout 2 s
    queue = owned_by(1, "relay.orphan")
    for b in c.shard_processes(1):
        c.kill(b)  # shard 1 has no process left: n1's client address is n1.s0's alone
    conn = connect(c.client_address("n1"))
    try:
        sender = conn.create_sender(queue)  # the relay takes the link at once, and waits for the owner
        with pytest.raises(LinkDetached) as refused:
            sender.send(Message(body="never"), timeout=20)
    finally:
        conn.close()
    assert "amqp:link:detach-forced" in str(refused.value)
    assert "no primary of shard 1 for 2 s (shard.relay_timeout)" in str(refused.value)


class _RelayedFor(LinkOption):
    """The link property a relay's mirror link carries: the client user it acts for."""

    def __init__(self, user: str) -> None:
        self.user = user

    def apply(self, link) -> None:
        link.properties = {symbol(RELAYED_FOR): self.user}


def _refusal(attach) -> tuple[str, str]:
    with pytest.raises(LinkDetached) as e:
        attach()
    return e.value.link.remote_condition.name, e.value.link.remote_condition.description


def test_a_relayed_link_has_its_clients_rights_and_the_peer_user_alone_none(shard_cluster) -> None:
    """The relay logs in to the owner as the HA peer user: there each link it opens is checked against the
    rights of the client it names, and the peer user's own link may neither send nor receive."""
    c = shard_cluster(size=2, shards=2, replicas=2)
    for b in c.brokers:  # the same users in every process, as one cluster file gives them
        b.config["users"]["app"] = {"password": "p2", "allow": {"send": ["orders.*"], "receive": ["orders.*"]}}
    c.start_shards()
    orders, payments = owned_by(1, "orders.relay"), owned_by(1, "payments.relay")
    entry = connect(c.client_address("n1"), user="app", password="p2")  # relayed to shard 1's primary
    try:
        entry.create_sender(orders).send(Message(body="o1"))
        assert _refusal(lambda: entry.create_sender(payments)) == (
            "amqp:unauthorized-access", f"user 'app' may not send to '{payments}'")
    finally:
        entry.close()
    owner = connect(c.shard_processes(1)[0].addresses[0], user=HA_USER, password=c.password)
    try:
        for attach in (lambda: owner.create_sender(orders), lambda: owner.create_receiver(orders)):
            assert _refusal(attach)[0] == "amqp:unauthorized-access"
        owner.create_sender(orders, options=_RelayedFor("app")).send(Message(body="o2"))
        assert _refusal(lambda: owner.create_sender(payments, options=_RelayedFor("app"))) == (
            "amqp:unauthorized-access", f"user 'app' may not send to '{payments}'")
    finally:
        owner.close()
    assert [m.body for m in receive(c.client_address("n2"), orders, 2)] == ["o1", "o2"]  # anonymous: all allowed
