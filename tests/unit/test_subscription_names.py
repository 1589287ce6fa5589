"""The names of subscription queues (haqueue/messaging/subscriptions.py, design/messaging.md): Artemis' scheme with
':' after the container-id, for the link names Qpid JMS gives a subscription's links."""
from __future__ import annotations

import pytest

from haqueue.messaging.subscriptions import queue_name


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
