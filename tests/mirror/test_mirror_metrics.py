"""The mirror's Prometheus metrics (design/metrics.md, "Mirror"): a source broker mirroring to a standby 50 ms away
(the delaying relay) shows its connection and each queue's lag on its scrape, the same figures `admin mirror status`
prints; the lag and the backlog limit show while the site link is cut and clear after the heal; the standby shows
its source connected, its epoch and the messages applied to each mirror queue; every family is documented; a broker
without a `mirror:` section exports none.
"""
from __future__ import annotations

from typing import Any

import pytest
from proton import Message

from delay_relay import DelayRelay
from ha_harness import send_all
from harness import free_port, wait_for
from metrics_scrape import families, scrape, value
from mirror_harness import MIRROR_PASSWORD, MIRROR_USER, SITE_DELAY, standby_config
from monitoring_files import documented

from haqueue.admin import AdminClient
from haqueue.cli import main

pytestmark = pytest.mark.timeout(120)

QUEUES = ["orders.0", "orders.1"]
BACKLOG_LIMIT = 1000  # mirror.max_backlog_bytes: the 100 messages published while the link is cut pass it


def mirror_status(address: str) -> dict[str, Any]:
    with AdminClient(address, 5.0) as client:
        code, description, answer = client.request("READ", "mirror")
    assert code == 200, description
    return answer


def queue_values(metrics: str, queue: str) -> dict[str, float | None]:
    samples = scrape(metrics)
    return {name: value(samples, f"haqueue_mirror_{name}", queue=queue)
            for name in ("lag_messages", "lag_seconds", "bytes_held_back", "backlog_limit_reached")}


def applied(samples: Any) -> dict[str, float | None]:
    """The standby's haqueue_mirror_applied_total of each queue mirrored from site-a."""
    return {q: value(samples, "haqueue_mirror_applied_total", source="site-a", queue=q) for q in QUEUES}


def applied_status(address: str) -> dict[str, int]:
    return {q["queue"]: q["applied"] for q in mirror_status(address)["standby"]["queues"]}


def test_mirror_metrics_follow_the_status_through_a_cut(broker_factory, capsys) -> None:
    standby_metrics, source_metrics = (f"127.0.0.1:{free_port()}" for _ in range(2))
    standby = broker_factory(standby_config(metrics={"listen": standby_metrics}), name="standby")
    host, port = standby.address.rsplit(":", 1)
    relay = DelayRelay((host, int(port)), SITE_DELAY)
    try:
        source = broker_factory(name="source", metrics={"listen": source_metrics}, mirror={
            "cluster": "site-a", "to": [relay.address], "username": MIRROR_USER, "password": MIRROR_PASSWORD,
            "queues": ["orders.*"], "max_backlog_bytes": BACKLOG_LIMIT})
        for queue in QUEUES:
            send_all(source.address, queue, [Message(id=f"{queue}-{i}", body=i, durable=True) for i in range(10)])

        def drained() -> bool:
            samples = scrape(source_metrics)
            return value(samples, "haqueue_mirror_connected") == 1 and all(
                value(samples, "haqueue_mirror_lag_messages", queue=q) == 0 for q in QUEUES)
        wait_for(drained, 30, message="the mirror's lag drains on the scrape")
        assert queue_values(source_metrics, "orders.0") == {"lag_messages": 0, "lag_seconds": 0, "bytes_held_back": 0,
                                                            "backlog_limit_reached": 0}
        wait_for(lambda: value(scrape(standby_metrics), "haqueue_mirror_source_connected", source="site-a") == 1, 10,
                 message="the standby shows its source connected")
        on_standby = scrape(standby_metrics)
        assert (value(on_standby, "haqueue_mirror_epoch"), value(on_standby, "haqueue_mirror_promoted")) == (1, 0)
        assert applied(on_standby) == {"orders.0": 10, "orders.1": 10} == applied_status(standby.address)
        assert value(on_standby, "haqueue_mirror_lag_messages", queue="orders.0") is None  # a source's series only

        # the site link cut: what is published meanwhile is the lag, over the backlog limit, as status says
        relay.cut()
        send_all(source.address, "orders.0", [Message(id=f"cut-{i}", body=i, durable=True) for i in range(100)])
        cut = queue_values(source_metrics, "orders.0")
        status: dict[str, Any] = {q["queue"]: q for q in mirror_status(source.address)["source"]["queues"]}["orders.0"]
        assert cut["lag_messages"] == status["lag_messages"] == 100, (cut, status)
        assert cut["bytes_held_back"] == status["bytes_held_back"] > BACKLOG_LIMIT
        assert cut["backlog_limit_reached"] == 1 and cut["lag_seconds"] > 0
        assert queue_values(source_metrics, "orders.1")["lag_messages"] == 0
        wait_for(lambda: value(scrape(source_metrics), "haqueue_mirror_connected") == 0, 10,
                 message="the source shows the mirror down")
        relay.heal()
        wait_for(drained, 30, message="the lag drains after the heal")
        assert queue_values(source_metrics, "orders.0")["backlog_limit_reached"] == 0
        assert applied(scrape(standby_metrics)) == {"orders.0": 110, "orders.1": 10} == applied_status(standby.address)
        assert main(["admin", "-b", source.address, "mirror", "promote"]) != 0  # a source has nothing to promote
        assert f"haqueue: {source.address} is not a standby: its mirror: section accepts no mirror" in \
            capsys.readouterr().err

        # every mirror family either side exports is documented, with its type and labels
        exported = {**families(source_metrics), **families(standby_metrics)}
        mirror = {name: kind for name, kind in exported.items() if name.startswith("haqueue_mirror_")}
        doc = {name: kind for name, kind in documented().items() if name.startswith("haqueue_mirror_")}
        assert mirror == doc
    finally:
        relay.close()


def test_no_mirror_no_mirror_metrics(broker_factory, capsys) -> None:
    """... nor a mirror status: `admin mirror status` says there is no mirror (not "unknown operation")."""
    metrics = f"127.0.0.1:{free_port()}"
    broker = broker_factory(metrics={"listen": metrics})
    assert not [name for name in families(metrics) if name.startswith("haqueue_mirror_")]
    assert main(["admin", "-b", broker.address, "mirror", "status"]) != 0
    assert f"haqueue: no mirror configured on {broker.address}: its config has no mirror: section" in \
        capsys.readouterr().err
