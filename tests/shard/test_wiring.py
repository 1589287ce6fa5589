"""Step 4 of design/sharding.md: exchanges and bindings declared at one process live in every shard, a queue's
name in every shard (a forwarding queue where it is not owned), and a message published to an exchange at any
node reaches the bound queues of every shard, through the forwarder where the queue is another shard's.

In the 2-node, 2-shard cluster, n1 hosts shard 0's primary and a backup of shard 1, n2 the reverse (with 3 nodes
and 3 shards, node i+1 shard i's primary and shard i-1's backup); the kernel hands a client connection at a
node's client address to any of the node's processes."""
from __future__ import annotations

import pytest
from proton import Message

from ha_harness import Load, Refused, connect, receive, send_all, wait_for
from haqueue.shard.forwarding_queues import FORWARD
from haqueue.shard.wiring_versions import STAMP, TOMBSTONES
from shard_harness import owned_by

pytestmark = pytest.mark.timeout(180)

# Each shard's queue is bound to a topic exchange with its key; a subject goes to the shards whose key matches.
KEYS = ["eu.*", "*.urgent", "#"]
ROUTES = {"eu.normal": {0, 2}, "us.urgent": {1, 2}, "eu.urgent": {0, 1, 2}, "us.normal": {2}}


@pytest.mark.parametrize("shards", [2, 3])
def test_an_exchange_routes_to_the_bound_queues_of_every_shard(shard_cluster, shards) -> None:
    """Nodes n1..nK, K shards of 2 replicas; shard i's preferred primary on node i+1."""
    c = shard_cluster(size=shards, shards=shards, replicas=2)
    c.start_shards()
    queues = [owned_by(shard, "wired", shards) for shard in range(shards)]
    nodes = list(c.hosts)
    entry = c.client_address(nodes[0])
    for queue in queues:
        c.request(entry, "CREATE", "queue", queue)
    c.request(entry, "CREATE", "exchange", "orders", {"type": "topic"})
    for queue, key in zip(queues, KEYS):
        c.request(entry, "CREATE", "binding", body={"exchange": "orders", "queue": queue, "key": key})
    for shard in range(shards):
        primary = c.shard_processes(shard)[0]
        assert "orders" in c.exchanges(primary)
        assert len(c.bindings(primary)) == shards
        for other in range(shards):  # every other shard's queue is a forwarding queue here
            if other != shard:
                assert c.queues(primary)[queues[other]]["args"][FORWARD] == other

    for node in nodes:  # published at every node, every subject 5 times
        send_all(c.client_address(node), "orders",
                 [Message(subject=subject, body=f"{node}-{subject}-{i}", durable=True)
                  for subject in ROUTES for i in range(5)])
    for shard, queue in enumerate(queues):
        expected = sorted(f"{node}-{subject}-{i}" for node in nodes for subject, bound in ROUTES.items()
                          if shard in bound for i in range(5))
        owner = c.shard_processes(shard)[0]
        c.wait_depth(owner, queue, len(expected))  # forwarded ones included
        got = receive(c.client_address(nodes[-1]), queue, len(expected))
        assert sorted(m.body for m in got) == expected
        c.wait_depth(owner, queue, 0)
    for shard in range(shards):  # the forwarding queues were emptied, once the owners confirmed
        for other in range(shards):
            c.wait_depth(c.shard_processes(shard)[0], queues[other], 0)

    c.request(c.client_address(nodes[-1]), "DELETE", "binding",
              body={"exchange": "orders", "queue": queues[1], "key": KEYS[1]})
    for shard in range(shards):
        assert len(c.bindings(c.shard_processes(shard)[0])) == shards - 1
    for node in nodes:
        send_all(c.client_address(node), "orders", [Message(subject="eu.urgent", body=f"after-{node}")])
    assert sorted(m.body for m in receive(entry, queues[0], shards)) == sorted(f"after-{node}" for node in nodes)
    for shard in range(shards):
        c.wait_depth(c.shard_processes(shard)[0], queues[1], 0)
    assert c.depth(c.shard_processes(1)[0], queues[1]) == 0  # unbound: nothing more for it


def test_a_refusal_names_the_shard_and_a_delete_reaches_every_shard(two_shards) -> None:
    c = two_shards
    entry = c.client_address("n2")
    with pytest.raises(Refused) as refused:
        c.request(entry, "CREATE", "binding", body={"exchange": "none-such", "queue": owned_by(0, "q")})
    assert refused.value.code == 404 and "shard 0 refused: no exchange named 'none-such'" in str(refused.value)
    with pytest.raises(Refused) as refused:
        c.request(entry, "CREATE", "queue", "placed", {"x-shard": 7})
    assert refused.value.code == 400 and "x-shard must be a shard number from 0 to 1, got 7" in str(refused.value)
    with pytest.raises(Refused) as refused:
        c.request(entry, "CREATE", "queue", "bogus", {FORWARD: 9})
    assert refused.value.code == 400 and "x-shard-forward must name another shard" in str(refused.value)
    info = c.request(c.publics[1], "CREATE", "queue", "placed", {"x-shard": 1})  # at its owner's primary
    assert info["name"] == "placed" and info["args"].keys() == {"x-shard", STAMP}  # the owner's, not a forwarding queue's
    assert c.request(c.publics[0], "CREATE", "queue", "placed", {"x-shard": 1}) is None  # the owner answered remotely
    c.request(entry, "CREATE", "exchange", "gone", {"type": "fanout"})
    for shard in range(2):
        primary = c.shard_processes(shard)[0]
        assert "gone" in c.exchanges(primary) and "placed" in c.queues(primary)
    send_all(c.client_address("n1"), "placed", ["to shard 1"])  # relayed to the owner its x-shard names
    c.wait_depth(c.shard_processes(1)[0], "placed", 1)
    c.request(entry, "DELETE", "exchange", "gone")
    c.request(entry, "DELETE", "queue", "placed")
    for shard in range(2):
        primary = c.shard_processes(shard)[0]
        assert "gone" not in c.exchanges(primary) and "placed" not in c.queues(primary)


def test_a_shard_without_a_primary_refuses_and_takes_the_wiring_once_it_has_one(shard_cluster) -> None:
    c = shard_cluster(size=2, shards=2, replicas=2)  # shard.relay_timeout 2 s
    first = [c.brokers.index(b) for b in c.shard_processes(0)]
    c.start(*first)  # shard 1 has no process yet
    c.promote(c.brokers[first[0]])
    c.wait_backups_ready(c.brokers[first[0]], [c.brokers[first[1]].name])
    queue = owned_by(0, "early")
    entry = c.publics[0]
    with pytest.raises(Refused) as refused:
        c.request(entry, "CREATE", "exchange", "early", {"type": "fanout"})
    assert "shard 1 refused: no primary of shard 1 for 2 s (shard.relay_timeout)" in str(refused.value)
    with pytest.raises(Refused):
        c.request(entry, "CREATE", "queue", queue)  # made in shard 0, its owner, and refused by shard 1
    with pytest.raises(Refused):
        c.request(entry, "CREATE", "binding", body={"exchange": "early", "queue": queue})
    c.start()
    later, backup = c.shard_processes(1)
    c.promote(later)  # a brand-new shard: it asks shard 0 for its wiring
    c.wait_backups_ready(later, [backup.name])
    [binding] = c.bindings(c.brokers[first[0]])  # its stamp too (wiring_versions.py)
    assert binding["exchange"] == "early" and binding["queue"] == queue
    wait_for(lambda: c.bindings(later) == [binding], 10, message="shard 0's binding in shard 1")
    assert "early" in c.exchanges(later) and c.queues(later)[queue]["args"][FORWARD] == 0
    wait_for(lambda: c.bindings(backup) == [binding], 10, message="and on its backup")
    send_all(c.publics[1], "early", ["from shard 1"])  # routed into shard 1's forwarding queue, forwarded
    assert [m.body for m in receive(c.client_address("n1"), queue, 1)] == ["from shard 1"]


def test_a_delete_missed_by_a_shard_without_a_primary_is_taken_on_its_promotion(two_shards) -> None:
    """kill -9 of shard 1's primary; through shard 0, a binding is deleted and another made (shard 1 refuses both);
    once shard 1's backup is promoted, it has the new binding and not the deleted one: what is published through
    the exchange at either shard reaches the queue still bound and the new one, and none reaches the unbound one."""
    c = two_shards
    gone, kept, made = (owned_by(0, prefix) for prefix in ("gone", "kept", "made"))
    entry = c.publics[0]
    for queue in (gone, kept, made):
        c.request(entry, "CREATE", "queue", queue)
    c.request(entry, "CREATE", "exchange", "fan", {"type": "fanout"})
    for queue in (gone, kept):
        c.request(entry, "CREATE", "binding", body={"exchange": "fan", "queue": queue})
    old, new = c.shard_processes(1)
    wait_for(lambda: {b["queue"] for b in c.bindings(new)} == {gone, kept}, 10, message="shard 1's backup bound")
    c.kill(old)
    for operation, queue in (("DELETE", gone), ("CREATE", made)):
        with pytest.raises(Refused) as refused:
            c.request(entry, operation, "binding", body={"exchange": "fan", "queue": queue})
        assert "shard 1 refused: no primary of shard 1" in str(refused.value)
    assert {b["queue"] for b in c.bindings(c.shard_processes(0)[0])} == {kept, made}  # applied in shard 0
    assert {b["queue"] for b in c.bindings(new)} == {gone, kept}  # not in shard 1
    c.promote(new)
    wait_for(lambda: {b["queue"] for b in c.bindings(new)} == {kept, made}, 10, message="shard 1 converged")
    for primary in (c.shard_processes(0)[0], new):  # the delete's tombstone, in each shard
        assert any(name.startswith(TOMBSTONES) for name in c.queues(primary))

    for shard in range(2):
        send_all(c.publics[shard], "fan", [f"via shard {shard} #{i}" for i in range(10)])
    expected = sorted(f"via shard {shard} #{i}" for shard in range(2) for i in range(10))
    for queue in (kept, made):
        assert sorted(m.body for m in receive(c.client_address("n2"), queue, 20)) == expected
    for queue in (made, kept):  # shard 1's forwarding queues drained into shard 0
        c.wait_depth(new, queue, 0)
    for process in (c.shard_processes(0)[0], new):  # the queue, and shard 1's forwarding queue: nothing ever came
        assert c.queues(process)[gone]["enqueued"] == 0


def test_a_shard_that_missed_a_delete_does_not_give_it_back(two_shards) -> None:
    """Both primaries lost: shard 1's before a binding is deleted through shard 0 (shard 1 refuses), shard 0's
    after. Shard 1's backup, promoted first, finds no primary of shard 0 to ask and asks again; shard 0's backup,
    which holds the delete's tombstone, is promoted next and asks shard 1, which still has the binding. Neither
    keeps it: what is published through the exchange at either shard reaches the other queue, none this one."""
    c = two_shards
    gone, kept = owned_by(0, "gone"), owned_by(0, "kept")
    entry = c.publics[0]
    for queue in (gone, kept):
        c.request(entry, "CREATE", "queue", queue)
    c.request(entry, "CREATE", "exchange", "fan", {"type": "fanout"})
    for queue in (gone, kept):
        c.request(entry, "CREATE", "binding", body={"exchange": "fan", "queue": queue})
    old0, new0 = c.shard_processes(0)
    old1, new1 = c.shard_processes(1)
    wait_for(lambda: len(c.bindings(new1)) == 2, 10, message="shard 1's backup bound")
    c.kill(old1)
    with pytest.raises(Refused):
        c.request(entry, "DELETE", "binding", body={"exchange": "fan", "queue": gone})
    wait_for(lambda: any(name.startswith(TOMBSTONES) for name in c.queues(new0)), 10,
             message="the tombstone replicated to shard 0's backup")
    c.kill(old0)
    c.promote(new1)
    wait_for(lambda: "shard 0's wiring not known here yet" in new1.log(), 15, message="shard 1's pull given up")
    assert {b["queue"] for b in c.bindings(new1)} == {gone, kept}  # still stale
    c.promote(new0)
    for shard, primary in ((0, new0), (1, new1)):
        wait_for(lambda: {b["queue"] for b in c.bindings(primary)} == {kept}, 10, message=f"shard {shard} converged")

    for shard in range(2):
        send_all(c.publics[shard], "fan", [f"via shard {shard} #{i}" for i in range(10)])
    expected = sorted(f"via shard {shard} #{i}" for shard in range(2) for i in range(10))
    assert sorted(m.body for m in receive(c.client_address("n2"), kept, 20)) == expected
    c.wait_depth(new1, kept, 0)  # shard 1's forwarding queue drained into shard 0
    for process in (new0, new1):
        assert c.queues(process)[gone]["enqueued"] == 0


def test_the_files_queues_exchanges_and_bindings_route_across_shards(shard_cluster) -> None:
    c = shard_cluster(size=2, shards=2, replicas=2)
    queue = owned_by(1, "configured")
    for b in c.brokers:  # one cluster file for every process
        b.config.update(queues=[{"name": queue}], exchanges=[{"name": "configured", "type": "fanout"}],
                        bindings=[{"exchange": "configured", "queue": queue}])
    c.start_shards()
    assert c.queues(c.shard_processes(0)[0])[queue]["args"][FORWARD] == 1  # shard 0 forwards, shard 1 owns it
    assert FORWARD not in c.queues(c.shard_processes(1)[0])[queue]["args"]
    for shard in range(2):
        send_all(c.publics[shard], "configured", [f"via shard {shard}"])
    assert sorted(m.body for m in receive(c.client_address("n1"), queue, 2)) == ["via shard 0", "via shard 1"]
    conn = connect(c.publics[0])  # the anonymous relay at shard 0: its forwarding queue takes it to shard 1
    try:
        conn.create_sender(None).send(Message(address=queue, body="relayed anonymously"))
    finally:
        conn.close()
    assert [m.body for m in receive(c.client_address("n2"), queue, 1)] == ["relayed anonymously"]


def test_a_client_subscribed_to_an_exchange_gets_what_every_shard_routes(two_shards) -> None:
    c = two_shards
    c.request(c.publics[0], "CREATE", "exchange", "events", {"type": "fanout"})
    mirrors = lambda: [name for name in c.queues(c.shard_processes(1)[0]) if name.startswith("events.sub.")]  # noqa: E731
    conn = connect(c.publics[0])  # served by shard 0's primary: its subscription queue is there
    try:
        r = conn.create_receiver("events", credit=10)
        wait_for(lambda: len(mirrors()) == 1, 10, message="the subscription mirrored in shard 1")
        send_all(c.publics[1], "events", ["from shard 1"])  # through shard 1's forwarding queue
        send_all(c.publics[0], "events", ["from shard 0"])
        got = [r.receive(timeout=10).body for _ in range(2)]
        assert sorted(got) == ["from shard 0", "from shard 1"]
    finally:
        conn.close()
    wait_for(lambda: mirrors() == [], 10, message="the mirror gone with the subscription")


class ExchangeLoad(Load):
    """Load's producer publishes to an exchange (its consumer still takes from the queue)."""

    def __init__(self, address: str, exchange: str, queue: str) -> None:
        super().__init__(address, queue)
        self.exchange = exchange

    def _produce(self) -> None:
        self._keep_going(self._stop_producer, lambda conn: conn.create_sender(self.exchange), self._send_next,
                         self._send_failed)


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["forwarding", "owning"])
def test_a_failover_of_either_shard_loses_no_confirmed_forwarded_message(two_shards, killed) -> None:
    """Published to a fanout exchange at shard 0's primary (its direct address), every message goes into shard 0's
    forwarding queue for a queue of shard 1, and is consumed there too (relayed to shard 1): kill -9 of the
    primary of shard 0 (the forwarding queue's) or of shard 1 (the queue's owner) mid-run loses none of them."""
    c = two_shards
    queue = owned_by(1, "forwarded")
    entry = c.publics[0]
    c.request(entry, "CREATE", "queue", queue)
    c.request(entry, "CREATE", "exchange", "fan", {"type": "fanout"})
    c.request(entry, "CREATE", "binding", body={"exchange": "fan", "queue": queue})
    old, new = c.shard_processes(0 if killed == "forwarding" else 1)
    _, report = ExchangeLoad(entry, "fan", queue).across(lambda: (c.kill(old), c.promote(new)), timeout=90)
    assert report["lost"] == [], report
    c.wait_depth(c.shard_processes(0)[1 if killed == "forwarding" else 0], queue, 0)  # shard 0's forwarding queue
