"""Transactions through the shard relay (design/sharding.md, "Transactions through the relay"): a stock
transactional client at any node commits and rolls back work on a queue of another shard; work on a second
shard in the same transaction is refused; the owner's primary killed before the commit rolls it back.

3 nodes, 2 shards of 2 replicas: shard 0 on n1 (preferred primary) and n2, shard 1 on n2 (preferred primary)
and n3. n1 runs only n1.s0 and n3 only n3.s1 (a backup), so a client at n1 is served by shard 0's primary
(a shard-1 queue is relayed) and one at n3 by a backup that relays every link."""
from __future__ import annotations

import os
import signal
import threading

import pytest
from proton import Message

from ha_harness import Load, receive, send_all
from harness import wait_for
from shard_harness import owned_by
from txn_client import OpenTransaction, run_transaction

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def three_nodes(shard_cluster):
    c = shard_cluster(size=3, shards=2, replicas=2)
    assert [list(nodes) for nodes in c.placement] == [["n1", "n2"], ["n2", "n3"]]
    c.start_shards()
    return c


def _url(c, node: str) -> str:
    return f"amqp://{c.client_address(node)}"


def test_a_transaction_commits_and_rolls_back_through_the_relay(three_nodes) -> None:
    c = three_nodes
    queue = owned_by(1, "txn.relay")
    owner = c.shard_processes(1)[0]
    committed = run_transaction(_url(c, "n1"), queue, [Message(body=f"t-{i}", durable=True) for i in range(10)])
    assert (committed.declared, committed.outcome) == (True, "committed"), committed
    assert [state for _, state, _, _ in committed.transfers] == ["transactional"] * 10  # the owner's state, passed on
    assert c.depth(owner, queue) == 10  # counted at the owner once committed
    aborted = run_transaction(_url(c, "n1"), queue, [Message(body=f"gone-{i}") for i in range(5)], commit=False)
    assert aborted.outcome == "aborted", aborted
    assert c.depth(owner, queue) == 10
    for b in c.shard_processes(0):
        assert queue not in c.queues(b)  # nothing where it was relayed from
    c.wait_depth(c.shard_processes(1)[1], queue, 10)  # the commit replicated to the owner's backup
    assert [m.body for m in receive(c.client_address("n2"), queue, 10)] == [f"t-{i}" for i in range(10)]


def test_messages_accepted_in_a_relayed_transaction_leave_at_commit_and_come_back_on_rollback(three_nodes) -> None:
    c = three_nodes
    queue = owned_by(1, "txn.accept")
    owner = c.shard_processes(1)[0]
    send_all(c.client_address("n1"), queue, [f"m-{i}" for i in range(10)])
    aborted = run_transaction(_url(c, "n3"), queue, receive=4, commit=False)
    assert (aborted.outcome, aborted.received) == ("aborted", [f"m-{i}" for i in range(4)]), aborted
    c.wait_depth(owner, queue, 10)  # released at the owner: redelivered below
    committed = run_transaction(_url(c, "n1"), queue, receive=4)
    assert (committed.outcome, committed.received) == ("committed", [f"m-{i}" for i in range(4)]), committed
    assert c.depth(owner, queue) == 6  # dequeued at commit, before the commit was answered
    assert [m.body for m in receive(c.client_address("n3"), queue, 6)] == [f"m-{i}" for i in range(4, 10)]


def test_received_and_sent_in_one_relayed_transaction_move_together(three_nodes) -> None:
    """Consume, transform, produce: two queues of shard 1, both relayed from n1, in one transaction."""
    c = three_nodes
    source, target = owned_by(1, "txn.source"), owned_by(1, "txn.target")
    owner = c.shard_processes(1)[0]
    send_all(c.client_address("n1"), source, ["in-0", "in-1"])
    result = run_transaction(_url(c, "n1"), target, [Message(body="out-0")], receive=2, receive_from=source)
    assert (result.outcome, result.received) == ("committed", ["in-0", "in-1"]), result
    assert (c.depth(owner, source), c.depth(owner, target)) == (0, 1)


@pytest.mark.parametrize("node", ["n1", "n3"])
def test_work_on_a_second_shard_is_refused_and_the_transaction_stays_good_for_the_first(three_nodes, node) -> None:
    """At n1 the shard-0 queue is served locally (n1.s0), at n3 relayed too: refused either way, naming both."""
    c = three_nodes
    first, second = owned_by(1, "txn.first"), owned_by(0, "txn.second")
    messages = [Message(address=first, body="a"), Message(address=second, body="b"), Message(address=first, body="c")]
    result = run_transaction(_url(c, node), None, messages, link_per_address=True)
    assert result.outcome == "committed", result
    by_body = {body: (state, condition, description) for body, state, condition, description in result.transfers}
    assert by_body["a"][0] == by_body["c"][0] == "transactional", result.transfers
    state, condition, description = by_body["b"]
    assert (state, condition) == ("rejected", "amqp:not-implemented"), result.transfers
    assert "shard 1's primary" in description and "shard 0" in description, description
    assert "no two-phase commit" in description, description
    assert c.depth(c.shard_processes(1)[0], first) == 2
    assert not c.depth(c.shard_processes(0)[0], second)  # never enqueued on shard 0


def test_a_relayed_transaction_after_local_work_is_refused(three_nodes) -> None:
    """The reverse order at n1: a shard-0 queue (served there) first, then one of shard 1 (relayed)."""
    c = three_nodes
    local, relayed = owned_by(0, "txn.local"), owned_by(1, "txn.relayed")
    messages = [Message(address=local, body="here"), Message(address=relayed, body="there")]
    result = run_transaction(_url(c, "n1"), None, messages, link_per_address=True)
    assert result.outcome == "committed", result
    by_body = {body: rest for body, *rest in result.transfers}
    assert by_body["here"][0] == "transactional", result.transfers
    state, condition, description = by_body["there"]
    assert (state, condition) == ("rejected", "amqp:not-implemented"), result.transfers
    assert "n1.s0 (shard 0)" in description and "shard 1's primary" in description, description
    assert c.depth(c.shard_processes(0)[0], local) == 1
    assert not c.depth(c.shard_processes(1)[0], relayed)


def test_the_owners_primary_killed_before_the_commit_rolls_the_relayed_transaction_back(three_nodes) -> None:
    c = three_nodes
    queue, steady = owned_by(1, "txn.kill"), owned_by(1, "txn.steady")
    old, new = c.shard_processes(1)  # n2.s1, n3.s1; the client is at n1 (n1.s0), which is not touched
    send_all(c.client_address("n1"), queue, [f"before-{i}" for i in range(3)])
    txn = OpenTransaction(_url(c, "n1"), queue, [Message(body=f"t-{i}", durable=True) for i in range(10)], receive=2)
    wait_for(txn.taken, 10, message="the owner took the ten messages and the client its two into the transaction")
    assert txn.result.received == ["before-0", "before-1"]
    load = Load(c.client_address("n1"), steady)  # confirmed publishes through the relay across the failover

    def failover() -> None:
        c.kill(old)
        c.promote(new)
        txn.finish()  # commit on the connection to n1, which never dropped
    _, report = load.across(failover)
    assert report["lost"] == [], report
    result = txn.join(30)
    assert (result.outcome, result.condition) == ("commit_failed", "amqp:transaction:rollback"), result
    assert "shard 1's primary" in result.description and "was lost" in result.description, result.description
    assert c.bodies(new, queue) == [f"before-{i}" for i in range(3)]  # nothing of it enqueued, both released
    got = receive(c.client_address("n1"), queue, 3)
    assert [m.body for m in got] == [f"before-{i}" for i in range(3)]  # the accepted two redelivered


def test_an_outcome_on_a_second_shard_makes_the_commit_roll_back(three_nodes) -> None:
    """An outcome has no answer of its own: accepting a relayed message of shard 1 in a transaction whose
    publish went to shard 0 (served at n1, before the message came) is refused at the commit, which rolls
    everything back."""
    c = three_nodes
    local, relayed = owned_by(0, "txn.out"), owned_by(1, "txn.in")
    send_all(c.client_address("n1"), relayed, ["in-0"])
    result = run_transaction(_url(c, "n1"), local, [Message(body="out-0")], receive=1, receive_from=relayed)
    assert result.received == ["in-0"], result
    assert [state for _, state, _, _ in result.transfers] == ["transactional"], result
    assert (result.outcome, result.condition) == ("commit_failed", "amqp:transaction:rollback"), result
    assert "n1.s0 (shard 0)" in result.description and "shard 1's primary" in result.description, result
    assert not c.depth(c.shard_processes(0)[0], local)  # its publish rolled back
    c.wait_depth(c.shard_processes(1)[0], relayed, 1)  # the accepted message released at the owner
    assert [m.body for m in receive(c.client_address("n3"), relayed, 1)] == ["in-0"]


def test_a_transactional_publish_the_lost_owner_never_settled_is_refused_not_sent_again(three_nodes) -> None:
    """Shard 1's primary is stopped (SIGSTOP) with a transaction open on it, two more messages are sent in
    the transaction and one outside it, then it is killed: after the failover the relay sends the plain
    one again (confirmed on the new primary) and refuses the two, which never reach the new primary."""
    c = three_nodes
    queue = owned_by(1, "txn.unsettled")
    old, new = c.shard_processes(1)
    txn = OpenTransaction(_url(c, "n1"), queue, [Message(body="t-0")])
    wait_for(txn.taken, 10, message="the owner took t-0 into the transaction")
    os.kill(old.pid, signal.SIGSTOP)
    try:
        txn.send_more([Message(body="t-1"), Message(body="t-2")])
        plain = threading.Thread(target=send_all, args=(c.client_address("n1"), queue, ["plain"]), daemon=True)
        plain.start()
    finally:
        c.kill(old)
    c.promote(new)
    plain.join(30)
    assert not plain.is_alive(), "the plain publish was confirmed after the failover"
    wait_for(lambda: len(txn.result.transfers) == 3, 20, message="an outcome for each transactional publish")
    refused = txn.result.transfers[1:]
    assert [(body, state, condition) for body, state, condition, _ in refused] == [
        ("t-1", "rejected", "amqp:transaction:rollback"), ("t-2", "rejected", "amqp:transaction:rollback")], refused
    assert "shard 1's primary" in refused[0][3] and "was lost" in refused[0][3], refused
    txn.finish()
    result = txn.join(20)
    assert (result.outcome, result.condition) == ("commit_failed", "amqp:transaction:rollback"), result
    assert c.bodies(new, queue) == ["plain"]
