"""Messaging semantics beyond a plain queue that Qpid, Artemis and JMS applications rely on (issue 28), each
plugged into the core through its named hooks (the registry's validators and queue_hooks, a queue's
redelivery_hook), so that a queue that does not use one pays nothing for it:

- poison.py         x-max-deliveries: a message that failed delivery too often goes to the dead-letter address.
- priority.py       x-priorities: higher priority first.
- groups.py         x-group-header: a group's messages to one consumer at a time, in order.
- last_value.py     x-last-value-key: a message replaces the queued one with the same key.
- scheduled.py      x-opt-delivery-time / -delay annotations: not delivered before then (every queue; a message
                    without annotations costs one byte compared).
- subscriptions.py  durable and shared subscriptions to an exchange (the broker's `subscriptions`).
The three arrangers (arrangers.py) are a queue's `arranger` hook; heaps.py holds their heaps of entries.
"""
from __future__ import annotations

from ..broker.server import Broker
from . import arrangers, poison, scheduled, subscriptions


def install(broker: Broker, sharded: bool) -> None:
    """Plug every feature of this package into the broker (each does nothing for a queue without its argument).
    `sharded`: a process of a sharded cluster, which has no durable or shared subscriptions yet."""
    poison.install(broker)
    scheduled.install(broker)
    broker.registry.validators.append(arrangers.validate)
    broker.registry.queue_hooks.append(arrangers.attach)
    subscriptions.install(broker, sharded)
