"""Subscription rules without a broker (haqueue/messaging/subscriptions.py, design/messaging.md): the queue names
(Artemis' scheme with ':' after the container-id, for the link names Qpid JMS gives a subscription's links), and
the refusal in a sharded cluster."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from haqueue.broker.errors import NOT_IMPLEMENTED, BrokerError
from haqueue.messaging.subscriptions import Subscriptions, queue_name


@pytest.mark.parametrize("link, durable, shared, global_, expected", [
    ("ticks", True, False, False, "app1:ticks"),  # createDurableSubscriber
    ("orders", True, True, False, "app1:orders"),  # createSharedDurableConsumer, first link
    ("orders|2", True, True, False, "app1:orders"),  # ... its second
    ("orders|global", True, True, True, "orders:global"),  # without a client id
    ("orders|global2", True, True, True, "orders:global"),
    ("feed|volatile1", False, True, False, "app1:feed:shared-volatile"),  # createSharedConsumer
    ("feed|global-volatile3", False, True, True, "feed:shared-volatile:global"),
    ("a|b", True, False, False, "app1:a|b"),  # not shared: the whole link name
])
def test_names(link, durable, shared, global_, expected):
    assert queue_name("app1", link, durable, shared, global_) == expected


def _link(durability: int, capabilities: list[str]) -> SimpleNamespace:
    return SimpleNamespace(source_capabilities=capabilities, source_durability=durability, source_expires_never=True,
                           remote_container="app1", name="ticks")


def test_a_sharded_cluster_refuses_durable_and_shared_subscriptions_and_leaves_the_others_temporary():
    subscriptions = Subscriptions(SimpleNamespace(registry=None), sharded=True)  # type: ignore[arg-type]
    exchange = SimpleNamespace(name="prices")
    for link in (_link(2, []), _link(0, ["shared"])):
        with pytest.raises(BrokerError) as e:
            subscriptions.subscribe(link, exchange, None)  # type: ignore[arg-type]
        assert e.value.condition == NOT_IMPLEMENTED and "not available in a sharded cluster" in e.value.description
    assert subscriptions.subscribe(_link(0, ["topic"]), exchange, None) is None  # type: ignore[arg-type]
