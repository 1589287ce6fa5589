"""A sharded haqueue under a real three-node Pacemaker cluster, run from one cluster file by the agent's `shard`
parameter and set up by packaging/pcs-shard-setup.sh from that file (pcmk_shards.py): each shard's clone is
promoted on its preferred primary's node with the shard's VIP beside it; a stock client at ONE node's VIP uses a
queue of every shard (relayed to the owner's VIP where the node's process does not own it); and a shard whose
primary is killed fails over to its ready backup, the relay following it, then back to its preferred node."""
from __future__ import annotations

import os
import signal
import time

import pytest
from proton import Message

from harness import wait_for
from ha_harness import connect
from pcmk_clients import Load
from pcmk_shards import CLIENT_PORT, RELAY_TIMEOUT, SHARDS, node_vip, shard_vip

from haqueue.shard.ownership import shard_of_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def queue_of(shard: int, prefix: str) -> str:
    """A queue name that hashes to `shard`."""
    return next(f"{prefix}{i}" for i in range(1000) if shard_of_name(f"{prefix}{i}", SHARDS) == shard)


def test_each_shard_is_promoted_on_its_preferred_node_with_its_vip_and_a_vip_per_node(sharded_pcmk_cluster):
    c = sharded_pcmk_cluster
    assert c.replicas == {0: ["node1", "node2"], 1: ["node2", "node3"]}
    ok, why = c.preferred_primaries()  # the fixture waited for it: still so (each shard's VIP on its primary too)
    assert ok, why
    for shard, replicas in c.replicas.items():
        primary = c.shard_broker(c.node(replicas[0]), shard)
        # epoch 1, or 2 when another replica's first monitor scored before the preferred one's and that
        # broker was promoted first: then the 9500 moved the primary once the preferred broker was ready
        assert primary["name"] == f"{replicas[0]}.s{shard}" and primary["epoch"] in (1, 2)
        assert c.on(c.node(replicas[0]), ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout.count(
            f" {shard_vip(shard)}/") == 1
    for node in c.nodes:
        assert c.roles(f"haqueue-vip-{node.name}") == {node.name: "Started"}


def test_a_stock_client_at_one_node_uses_a_queue_of_every_shard(sharded_pcmk_cluster):
    """node3 holds only shard 1's backup: at its VIP every link is relayed, shard 0's to shard 0's VIP on node1,
    shard 1's to shard 1's on node2."""
    c = sharded_pcmk_cluster
    c.wait_preferred_primaries()
    node3 = c.node("node3")
    queues = {shard: queue_of(shard, "every") for shard in range(SHARDS)}
    count = 40
    conn = connect(f"{node_vip(node3)}:{CLIENT_PORT}", timeout=10)
    try:
        for shard, queue in queues.items():
            sender = conn.create_sender(queue)
            for i in range(count):
                sender.send(Message(body=f"{queue}-{i}", durable=True), timeout=10)  # confirmed by the owner
            sender.close()
        received = {}
        for shard, queue in queues.items():
            receiver = conn.create_receiver(queue, credit=count)
            received[queue] = []
            for _ in range(count):
                received[queue].append(receiver.receive(timeout=10).body)
                receiver.accept()  # this one
            receiver.close()
    finally:
        conn.close()
    assert received == {q: [f"{q}-{i}" for i in range(count)] for q in queues.values()}
    for shard, queue in queues.items():  # each on its owning shard's primary, and only there
        primary = c.node(c.replicas[shard][0])
        with c.shard_admin(primary, shard) as client:
            code, _, body = client.request("READ", "queue", queue)
        assert code < 400 and body["depth"] == 0 and body["enqueued"] == count, body


def test_a_killed_shard_primary_fails_over_under_a_relayed_producer_losing_nothing(sharded_pcmk_cluster):
    """kill -9 of shard 0's primary on its preferred node (node1) while a producer and a consumer at node3's VIP
    use a shard-0 queue through node3's relay: Pacemaker promotes the ready backup on node2 and moves shard 0's
    VIP there (not the killed broker restarted in place, which joins with no score), the relay re-attaches to the
    new primary through the VIP; once the node1 broker has caught up and is ready, the 9500 moves the primary
    back, the relay following again."""
    c = sharded_pcmk_cluster
    c.wait_preferred_primaries()
    preferred, other = (c.node(n) for n in c.replicas[0])
    epoch = c.shard_broker(preferred, 0)["epoch"]
    load = Load(f"{node_vip(c.node('node3'))}:{CLIENT_PORT}", queue_of(0, "failover"))
    load.send_timeout = RELAY_TIMEOUT + 10  # the client waits on its link while the relay finds the new primary
    load.start()
    try:
        wait_for(lambda: load.confirmed_count() >= 50, 30, message="50 confirmed before the kill")
        os.kill(c.shard_pid(preferred, 0), signal.SIGKILL)
        killed = time.monotonic()

        def other_primary() -> bool:
            status = c.shard_broker(other, 0)
            return c.roles("haqueue-s0").get(other.name) == "Promoted" and bool(status) and \
                status["role"] == "primary"
        wait_for(other_primary, 60, interval=0.2, message=f"shard 0 primary on {other.name}")
        took_over = time.monotonic() - killed
        base = load.confirmed_count()
        # bounded by the relay's wait: it reaches the new primary once the shard's VIP is there
        wait_for(lambda: load.confirmed_count() >= base + 50, RELAY_TIMEOUT, message="50 confirmed by the new primary")
        relayed_again = time.monotonic() - killed
        c.wait_preferred_primaries(120)
        failed_back = time.monotonic() - killed
        base = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= base + 50, RELAY_TIMEOUT, message="50 confirmed after the failback")
    finally:
        load.stop()
    report = load.report()
    print(f"shard 0: {other.name} primary {took_over:.1f}s after the kill, 50 more confirmed through the relay "
          f"{relayed_again:.1f}s after it, back on {preferred.name} after {failed_back:.1f}s; {report}")
    assert report["lost"] == [], report
    assert report["errors"] == 0, report  # the client saw pauses, never an error: the relay followed both failovers
    assert c.shard_broker(preferred, 0)["epoch"] == epoch + 2  # two failovers: the kill, the failback
