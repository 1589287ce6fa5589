"""Transactions on a replicated queue: a commit is confirmed once every ready backup has what it
enqueued; a failover in the middle of a transaction rolls it back, and the client that comes back
to the new primary is told so."""
from __future__ import annotations

from proton import Message

from ha_harness import send_all, wait_for
from txn_client import OpenTransaction, discharge, run_transaction


def test_a_committed_transaction_is_on_every_backup_when_its_commit_is_confirmed(ha_cluster):
    """Publishes to two queues and accepts from a third, committed at once: replicated in parts, one
    per queue, applied whole by each backup before the commit is confirmed."""
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "src", [Message(body=f"s-{i}", durable=True) for i in range(5)])
    for b in c.brokers:
        c.wait_depth(b, "src", 5)
    sent = [Message(address=f"tx{i % 2}", body=i, durable=True) for i in range(20)]
    result = run_transaction(f"amqp://{c.public}", None, sent, receive=3, receive_from="src")
    assert (result.outcome, result.received) == ("committed", ["s-0", "s-1", "s-2"]), result
    for b in c.brokers:  # no waiting: the commit was confirmed only once every ready backup held it all
        assert c.bodies(b, "tx0") == list(range(0, 20, 2)), b.name
        assert c.bodies(b, "tx1") == list(range(1, 20, 2)), b.name
        assert c.bodies(b, "src") == ["s-3", "s-4"], b.name
    assert p.running


def test_a_failover_in_the_middle_of_a_transaction_rolls_it_back(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "tx", [Message(body="before", durable=True)])
    txn = OpenTransaction(f"amqp://{c.public}", "tx", [Message(body=f"t-{i}", durable=True) for i in range(10)])
    wait_for(txn.taken, 10, message="the primary took the ten messages into the transaction")
    c.kill(p)
    new = wait_for(lambda: c.best_backup(exclude=[p]), 10, message="a ready backup")
    c.promote(new)
    lost = txn.join(20)
    assert lost.outcome == "none" and lost.condition, lost  # its connection went with the primary
    reply = discharge(f"amqp://{c.public}", lost.txn_id)
    assert (reply.outcome, reply.condition) == ("commit_failed", "amqp:transaction:rollback"), reply
    assert "rolled back" in reply.description and "failover" in reply.description
    for b in c.brokers:
        if b.running:
            assert c.bodies(b, "tx") == ["before"], b.name
