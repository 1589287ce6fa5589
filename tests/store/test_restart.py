"""A broker restarted on its data dir, with real processes and files: what survives, torn and corrupt
journals, compaction, and the store's status."""
from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest
from proton import Message

from clients import Client, bodies
from harness import run_haqueue, wait_for


def _journal(broker) -> str:
    return os.path.join(broker.config["data_dir"], "journal")


def _segments(broker) -> list[str]:
    return sorted(os.listdir(_journal(broker)))


def failed_start(broker) -> int:
    """Start a broker that is expected to refuse to run; its exit code."""
    broker.start(wait=False)
    try:
        return broker.wait(timeout=15)
    finally:
        broker.kill()


def test_restart_keeps_durable_messages_and_wiring_and_drops_transient_ones(broker_factory):
    b = broker_factory(auto_create=["*"])
    with Client(b) as c:
        c.mgmt("CREATE", "queue", "orders", {"max_depth": 50, "x-app": "shop"})
        c.mgmt("CREATE", "exchange", "events", {"type": "topic"})
        c.mgmt("CREATE", "binding", body={"exchange": "events", "queue": "orders", "key": "order.#"})
        c.mgmt("CREATE", "queue", "scratch", {"durable": False})
        c.send("orders", [Message(body=f"d{i}", durable=True) if i % 2 == 0 else Message(body=f"t{i}")
                          for i in range(10)])
        c.send("scratch", [Message(body="gone", durable=True)])
        c.send("events", [Message(body="routed", subject="order.new", durable=True)])
        assert bodies(c.receiver("orders", credit=1).receive_n(1)) == ["d0"]  # accepted: gone for good
        c.roundtrip()
    b.kill()
    b.start()
    with Client(b) as c:
        names = c.queue_names()
        assert "orders" in names and "scratch" not in names
        info = c.mgmt("READ", "queue", "orders").body
        assert info["args"] == {"max_depth": 50, "x-app": "shop"}
        assert [x["name"] for x in c.mgmt("QUERY", "exchange").body] == ["events"]
        c.send("events", [Message(body="after", subject="order.paid", durable=True)])  # the binding is back
        got = c.receiver("orders", credit=10).receive_n(6)
        assert bodies(got) == ["d2", "d4", "d6", "d8", "routed", "after"]


def test_order_and_delivery_count_survive(broker_factory):
    b = broker_factory()
    with Client(b) as c:
        c.send("q", [Message(body=i, durable=True) for i in range(5)])
        r = c.receiver("q", credit=1)
        first = r.receive()
        r.modify(first, failed=True)  # a failed delivery: delivery-count 1, back at its place
        c.roundtrip()
    b.kill()
    b.start()
    with Client(b) as c:
        got = c.receiver("q", credit=5).receive_n(5)
        assert bodies(got) == [0, 1, 2, 3, 4]
        assert [m.message.delivery_count for m in got] == [1, 0, 0, 0, 0]


def test_a_publish_is_confirmed_only_once_its_record_is_on_disk(broker_factory):
    """Every confirmed durable message is in the journal the moment it is confirmed: kill -9 right after
    the last confirmation loses none."""
    b = broker_factory()
    with Client(b) as c:
        c.send("q", [Message(body=i, durable=True) for i in range(2000)])
    b.kill()
    with Client(b.start()) as c:
        assert c.queue_depth("q") == 2000
        assert bodies(c.receiver("q", credit=2000).receive_n(2000)) == list(range(2000))


def test_a_torn_tail_is_truncated_with_a_log_line_and_the_rest_recovered(broker_factory):
    b = broker_factory()
    with Client(b) as c:
        c.send("q", [Message(body=i, durable=True) for i in range(3)])
    b.kill()
    path = os.path.join(_journal(b), _segments(b)[-1])
    with open(path, "ab") as f:
        f.write(b"HQ\x00\x00\x10\x00garbage")  # a record cut short by a crash
    b.start()
    assert "torn record at offset" in b.log() and "truncating there" in b.log()
    with Client(b) as c:
        assert bodies(c.receiver("q", credit=3).receive_n(3)) == [0, 1, 2]


def test_corruption_mid_file_stops_the_broker_naming_file_and_offset(broker_factory):
    b = broker_factory()
    with Client(b) as c:
        c.send("q", [Message(body="x" * 100, durable=True) for _ in range(3)])
    b.kill()
    path = os.path.join(_journal(b), _segments(b)[-1])
    data = bytearray(open(path, "rb").read())
    where = data.index(b"x" * 100)  # inside the first message record
    data[where] ^= 0x01
    open(path, "wb").write(bytes(data))
    assert failed_start(b) == 2
    log = b.log()
    assert f"{path}: corrupt record at offset" in log and "checksum mismatch" in log
    assert "restore" in log  # says what to do
    check = run_haqueue(["store", "check", b.config["data_dir"]])
    assert check.returncode == 1 and "corrupt record at offset" in check.stderr


def test_compaction_keeps_the_journal_bounded_under_churn(broker_factory):
    b = broker_factory(store={"segment_bytes": 64 * 1024})
    payload = "p" * 1000
    with Client(b) as c:
        c.send("keep", [Message(body="old", durable=True)])  # a long-lived message in the first segment
        r = c.receiver("churn", credit=0)
        for _ in range(20):  # 2 MB of churn through 64 KB segments
            c.send("churn", [Message(body=payload, durable=True) for _ in range(100)])
            r.flow(100)
            r.receive_n(100)

        def small():
            status = c.mgmt("READ", "store").body
            return status if status["bytes"] < 400 * 1024 else None
        status = wait_for(small, 15, message="compaction")
        assert status["live_messages"] == 1
    b.kill()
    with Client(b.start()) as c:
        assert bodies(c.receiver("keep", credit=1).receive_n(1)) == ["old"]
        assert c.queue_depth("churn") == 0


def test_store_status_and_offline_check(broker_factory):
    b = broker_factory()
    with Client(b) as c:
        c.send("q", [Message(body=i, durable=True) for i in range(4)])
    status = run_haqueue(["admin", "-b", b.address, "store", "status"])
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["live_messages"] == 4 and shown["segments"] >= 1 and shown["syncs"] >= 1
    assert shown["last_sync_ms"] is not None and shown["failing"] is None
    age = datetime.now(timezone.utc) - datetime.fromisoformat(shown["oldest_record"])
    assert timedelta(0) <= age < timedelta(minutes=5)
    b.stop()
    check = run_haqueue(["store", "check", b.config["data_dir"]])
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["queues"] == {"q": 4}


def test_bad_store_config_is_refused(broker_factory):
    b = broker_factory(store={"compact_ratio": 1}, start=False)
    assert failed_start(b) == 2
    assert "store.compact_ratio: must be a number >= 1.2, got 1" in b.log()


@pytest.mark.parametrize("size", [64 * 1024, 1024 * 1024, 10 * 1024 * 1024], ids=["64KB", "1MB", "10MB"])
def test_large_durable_messages_survive_a_kill_byte_for_byte(broker_factory, size):
    """Their journal records are written as a head and the message's own bytes: read back whole."""
    sent = [os.urandom(size) for _ in range(3)]
    b = broker_factory()
    with Client(b, timeout=60) as c:
        c.send("q.large", [Message(body=x, durable=True) for x in sent], timeout=60)
    b.kill()
    b.start()
    with Client(b, timeout=60) as c:
        got = c.receiver("q.large", credit=3).receive_n(3, timeout=60)
        assert [bytes(r.body) for r in got] == sent
