"""Local transactions as proton's tx_send/tx_recv examples use them: publishes and accepts under a
transaction take effect at commit, all at once, and not at all on rollback; durable ones survive a
kill whole; a discharge for a transaction the broker does not hold is refused with the reason."""
from __future__ import annotations

import pytest
from proton import Message

from clients import Client, bodies, make_messages
from txn_client import discharge, run_transaction

pytestmark = pytest.mark.timeout(90)


def test_published_in_a_transaction_appear_at_commit_and_never_after_rollback(broker):
    with Client(broker) as c:
        c.send("tq", make_messages(3, prefix="plain"))
    committed = run_transaction(broker.url(), "tq", [Message(body=f"t-{i}") for i in range(10)])
    assert (committed.declared, committed.outcome) == (True, "committed"), committed
    aborted = run_transaction(broker.url(), "tq", [Message(body=f"gone-{i}") for i in range(5)], commit=False)
    assert aborted.outcome == "aborted", aborted
    with Client(broker) as c:
        assert c.queue_depth("tq") == 13
        got = c.receiver("tq").receive_n(13)
        assert bodies(got) == [f"plain-{i}" for i in range(3)] + [f"t-{i}" for i in range(10)]


def test_accepted_in_a_transaction_leave_the_queue_at_commit_and_come_back_on_rollback(broker):
    with Client(broker) as c:
        c.send("ta", make_messages(10, prefix="m"))
    aborted = run_transaction(broker.url(), "ta", receive=4, commit=False)
    assert (aborted.outcome, aborted.received) == ("aborted", [f"m-{i}" for i in range(4)]), aborted
    with Client(broker) as c:
        assert c.queue_depth("ta") == 10
    committed = run_transaction(broker.url(), "ta", receive=4)
    assert (committed.outcome, committed.received) == ("committed", [f"m-{i}" for i in range(4)]), committed
    with Client(broker) as c:
        assert c.queue_depth("ta") == 6
        assert bodies(c.receiver("ta").receive_n(6)) == [f"m-{i}" for i in range(4, 10)]


def test_a_publish_refused_in_a_transaction_makes_its_commit_roll_back(broker_factory):
    broker = broker_factory({"auto_create": []})
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "known")
    result = run_transaction(broker.url(), "known", [Message(body="ok")])
    assert result.outcome == "committed", result
    result = run_transaction(broker.url(), None, [Message(address="known", body="a"), Message(address="nowhere", body="b")])
    assert (result.outcome, result.condition) == ("commit_failed", "amqp:transaction:rollback"), result
    assert "nowhere" in result.description, result.description
    with Client(broker) as c:
        assert bodies(c.receiver("known").receive_n(1)) == ["ok"]
        assert c.queue_depth("known") == 0


def test_durable_transactions_survive_a_kill_whole(broker_factory, tmp_path):
    broker = broker_factory({"data_dir": str(tmp_path / "data")})
    for t in range(5):
        result = run_transaction(broker.url(), "td", [Message(body=f"{t}-{i}", durable=True) for i in range(20)])
        assert result.outcome == "committed", result
    broker.kill()
    broker.start()
    with Client(broker) as c:
        assert c.queue_depth("td") == 100
        assert bodies(c.receiver("td").receive_n(100)) == [f"{t}-{i}" for t in range(5) for i in range(20)]


def test_a_discharge_of_a_transaction_from_another_broker_process_says_it_was_rolled_back(broker):
    reply = discharge(broker.url(), b"elsewhere:1234:1:7")
    assert (reply.outcome, reply.condition) == ("commit_failed", "amqp:transaction:rollback"), reply
    assert "rolled back" in reply.description
