"""shard/relayed_transactions.py: when a relayed transaction's discharge is passed to the owner, and what the
client's discharge is answered when the owner is lost before or after it (the in-doubt case, which real
processes cannot time). The owner connection and its links are stand-ins; the transactions are the core's."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from proton import Message

from haqueue.broker.errors import BrokerError
from haqueue.broker.transactions import Transactions
from haqueue.shard.relayed_transactions import RelayedTransactions


class _ControlLink:
    """The relay's coordinator link at the owner: what it sent, as (kind, fields)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any]]] = []

    def credit(self) -> int:
        return 10

    def send(self, data: bytes) -> int:
        message = Message()
        message.decode(data)
        kind = str(message.body.descriptor).split(":")[1]
        self.sent.append((kind, list(message.body.value)))
        return len(self.sent)


class _Owner:
    """An owner connection that is open: a link added is attached at once."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.relay = SimpleNamespace(link_name=lambda name: f"{name}/relay-1")
        self.link = _ControlLink()
        self.conn = SimpleNamespace(open_link=lambda *args, **kwargs: self.link)
        self.links: list[Any] = []

    def add(self, link: Any) -> None:
        self.links.append(link)
        link.attach(self.conn)

    def remove(self, link: Any) -> None:
        self.links.remove(link)


def _setup() -> tuple[Transactions, RelayedTransactions, _Owner, Any, bytes]:
    transactions = Transactions(SimpleNamespace(name="n1.s0"))  # type: ignore[arg-type]
    client = SimpleNamespace(conn=object())
    txn = transactions.declare(client)  # type: ignore[arg-type]
    return transactions, RelayedTransactions(transactions), _Owner(1), client.conn, txn.id


def _discharge(transactions: Transactions, txn_id: bytes, conn: Any, fail: bool = False) -> list[Any]:
    answers: list[Any] = []
    transactions.discharge(transactions.find(txn_id, conn), fail, lambda *answer: answers.append(answer))
    return answers


def test_the_commit_is_passed_on_after_the_work_under_it_and_answered_with_the_owners_outcome() -> None:
    transactions, relayed, owner, conn, txn_id = _setup()
    remote = relayed.bind(txn_id, conn, owner)  # type: ignore[arg-type]
    assert owner.link.sent == [("declare", [])]
    remote.unsent += 1  # a transfer under it waits in a relayed publisher
    outcome_passed: list[bool] = []
    remote.when_declared(lambda: outcome_passed.append(owner.link.sent[-1][0] == "declare"))
    answers = _discharge(transactions, txn_id, conn)
    remote.declared(b"owner-7")
    assert outcome_passed == [True]  # an outcome waiting for the declare went before any discharge
    assert owner.link.sent == [("declare", [])]  # the transfer has not gone yet
    remote.sent_one()
    assert owner.link.sent[-1] == ("discharge", [b"owner-7", False])
    assert answers == []
    remote.answered(None)
    assert answers == [(None, "")]


def test_the_owner_lost_before_the_commit_rolls_it_back_and_after_it_leaves_the_outcome_unknown() -> None:
    transactions, relayed, owner, conn, txn_id = _setup()
    remote = relayed.bind(txn_id, conn, owner)  # type: ignore[arg-type]
    remote.declared(b"owner-1")
    coordinator = owner.links[0]
    coordinator.owner_lost()
    answers = _discharge(transactions, txn_id, conn)
    (condition, description), = answers
    assert condition == "amqp:transaction:rollback"
    assert description == (f"transaction '{txn_id.decode()}' was rolled back: shard 1's primary, which held its "
                           f"work, was lost (the relay's connection to it dropped)")

    transactions, relayed, owner, conn, txn_id = _setup()
    remote = relayed.bind(txn_id, conn, owner)  # type: ignore[arg-type]
    remote.declared(b"owner-1")
    answers = _discharge(transactions, txn_id, conn)
    assert owner.link.sent[-1] == ("discharge", [b"owner-1", False])
    owner.links[0].owner_lost()
    (condition, description), = answers
    assert condition == "amqp:internal-error"
    assert description.startswith(f"the outcome of transaction '{txn_id.decode()}' is unknown: shard 1's primary")
    assert "(it may have committed)" in description


def test_a_rollback_of_a_lost_transaction_is_answered_as_done_and_a_second_shard_is_refused() -> None:
    transactions, relayed, owner, conn, txn_id = _setup()
    relayed.bind(txn_id, conn, owner)  # type: ignore[arg-type]
    with pytest.raises(BrokerError) as refused:
        relayed.bind(txn_id, conn, _Owner(0))  # type: ignore[arg-type]
    assert refused.value.condition == "amqp:not-implemented"
    assert "has its work on shard 1's primary; work on shard 0's primary cannot join it" in refused.value.description
    owner.links[0].owner_lost()
    assert _discharge(transactions, txn_id, conn, fail=True) == [(None, "")]
