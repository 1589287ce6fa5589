"""The Prometheus endpoint of one broker (design/metrics.md): what an operator's scrape shows as
messages come and go, flags and config, and errors that name the problem."""
from __future__ import annotations

import pytest
from proton import Message

import haqueue
from haqueue.ha.protocol import PROTOCOL

from clients import Client
from harness import BrokerProcess, free_port, run_haqueue, wait_for
from metrics_scrape import get, scrape, value

pytestmark = pytest.mark.timeout(90)


def metrics_broker(broker_factory, **config) -> tuple[BrokerProcess, str]:
    address = f"127.0.0.1:{free_port()}"
    return broker_factory(metrics={"listen": address}, **config), address


def queue_values(address: str, queue: str) -> dict[str, float | None]:
    samples = scrape(address)
    names = ("depth", "bytes", "consumers", "enqueued_total", "dequeued_total", "expired_total",
             "dead_lettered_total")
    return {name: value(samples, f"haqueue_queue_{name}", queue=queue) for name in names}


def test_queue_values_move_with_traffic(broker_factory):
    broker, metrics = metrics_broker(broker_factory, queues=[
        {"name": "work", "args": {"dead_letter_address": "dlq"}}, {"name": "dlq"}])
    assert queue_values(metrics, "work") == {"depth": 0, "bytes": 0, "consumers": 0, "enqueued_total": 0,
                                             "dequeued_total": 0, "expired_total": 0, "dead_lettered_total": 0}
    with Client(broker) as c:
        c.send("work", [Message(body=f"m{i}") for i in range(25)])
        v = queue_values(metrics, "work")
        assert (v["depth"], v["enqueued_total"], v["dequeued_total"]) == (25, 25, 0), v
        assert v["bytes"] > 25 * 2, v
        receiver = c.receiver("work")
        got = receiver.receive_n(10)  # accepted
        receiver.reject(receiver.receive())  # dead-lettered to dlq
        c.roundtrip()
        v = queue_values(metrics, "work")
        assert (v["depth"], v["dequeued_total"], v["dead_lettered_total"], v["consumers"]) == (14, 11, 1, 1), v
        assert len(got) == 10
        assert queue_values(metrics, "dlq")["depth"] == 1
        samples = scrape(metrics)
        assert value(samples, "haqueue_connections") >= 1
        assert value(samples, "haqueue_links") >= 2  # this client's sender and receiver
        receiver.close()
        c.roundtrip()
    assert queue_values(metrics, "work")["consumers"] == 0


def test_expired_messages_count(broker_factory):
    broker, metrics = metrics_broker(broker_factory)
    with Client(broker) as c:
        c.send("ttl", [Message(body="short", ttl=0.1) for _ in range(3)] + [Message(body="stays")])
    # the broker's sweep drops them within a second or so of their expiry
    wait_for(lambda: queue_values(metrics, "ttl")["expired_total"] == 3, 10, message="3 expired on the scrape")
    v = queue_values(metrics, "ttl")
    assert (v["depth"], v["enqueued_total"], v["dequeued_total"]) == (1, 4, 3), v


def test_broker_role_state_and_blocked_publishers(broker_factory):
    broker, metrics = metrics_broker(broker_factory, queues=[{"name": "small", "args": {"max_depth": 5}}])
    samples = scrape(metrics)
    assert value(samples, "haqueue_role", role="standalone") == 1
    assert value(samples, "haqueue_role", role="primary") == 0
    assert value(samples, "haqueue_state", state="active") == 1
    assert value(samples, "haqueue_broker_info", broker=broker.name, version=haqueue.__version__) == 1
    assert value(samples, "haqueue_build_info", version=haqueue.__version__, protocol=str(PROTOCOL)) == 1
    assert value(samples, "haqueue_queue_max_depth", queue="small") == 5
    assert value(samples, "haqueue_publishers_blocked") == 0
    assert value(samples, "haqueue_journal_fsync_seconds_count") >= 0
    with Client(broker) as c:
        c.send("small", range(8))  # overflow block: accepted, then the link gets no more credit
        assert value(scrape(metrics), "haqueue_publishers_blocked") == 1
        c.receiver("small").receive_n(8)
        c.roundtrip()
        assert value(scrape(metrics), "haqueue_publishers_blocked") == 0


def test_durable_publishes_show_in_the_journal_and_its_sync_histogram(broker_factory):
    broker, metrics = metrics_broker(broker_factory)
    before = scrape(metrics)
    with Client(broker) as c:
        c.send("d", [Message(body="x" * 1000, durable=True) for _ in range(20)])
    after = scrape(metrics)
    assert value(after, "haqueue_journal_bytes") >= value(before, "haqueue_journal_bytes") + 20 * 1000
    count = value(after, "haqueue_journal_fsync_seconds_count")
    assert count > value(before, "haqueue_journal_fsync_seconds_count")
    assert value(after, "haqueue_journal_fsync_seconds_bucket", le="+Inf") == count
    assert value(after, "haqueue_journal_fsync_seconds_sum") > 0


def test_temporary_queues_are_counted_not_listed(broker_factory):
    broker, metrics = metrics_broker(broker_factory)
    with Client(broker) as c:
        temporary = c.receiver(dynamic=True).address
        samples = scrape(metrics)
        assert value(samples, "haqueue_queues") >= 1
        assert not [key for key in samples if dict(key[1]).get("queue") == temporary]


def test_metrics_from_the_command_line_and_only_at_its_path(tmp_path):
    metrics = f"127.0.0.1:{free_port()}"
    b = BrokerProcess(tmp_path / "cli", name="cli", extra_args=["--metrics", metrics])  # with --config: in its place
    b.start()
    try:
        assert value(scrape(metrics), "haqueue_broker_info", broker="cli", version=haqueue.__version__) == 1
        status, body = get(metrics, "/")
        assert status == 404 and "/metrics" in body
    finally:
        b.stop()


def test_bad_metrics_config_and_taken_port_are_named(tmp_path, broker_factory):
    config = tmp_path / "bad.yaml"
    config.write_text("metrics: {listen: nowhere}\n")
    p = run_haqueue(["broker", "--config", str(config)], timeout=30)
    assert p.returncode == 2 and "metrics.listen: must be HOST:PORT" in p.stderr, p.stderr
    config.write_text("metrics: {port: 9100}\n")
    p = run_haqueue(["broker", "--config", str(config)], timeout=30)
    assert p.returncode == 2 and "metrics.port: unknown key" in p.stderr, p.stderr
    p = run_haqueue(["broker", "--metrics", "localhost"], timeout=30)
    assert p.returncode == 2 and "--metrics" in p.stderr and "HOST:PORT" in p.stderr, p.stderr
    _, taken = metrics_broker(broker_factory)
    p = run_haqueue(["broker", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"),
                     "--metrics", taken], timeout=30)
    assert p.returncode == 1 and f"metrics.listen {taken}" in p.stderr and "in use" in p.stderr, p.stderr
