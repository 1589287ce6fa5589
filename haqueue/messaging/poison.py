"""Poison messages: a queue declared with `x-max-deliveries: N` takes a message out once its delivery-count
reaches N, instead of offering it again: to the queue's `dead_letter_address` with the reason in its message
annotations, or, without one, dropped (logged). Both count in the queue's `poisoned` (admin queue list, metrics).

A failed delivery raises the delivery-count: the outcome modified with delivery-failed (what Qpid JMS sends for
a recovered or rolled-back message), or a consumer that detached or died holding the message. A plain
`released` does not: AMQP defines it as not delivered, and a client that stops sends it for what it had
prefetched (design/messaging.md).
"""
from __future__ import annotations

import logging
from typing import Any

from ..broker.message import delivery_count
from ..broker.queue import Entry, Queue
from ..broker.server import Broker
from .annotations import with_annotations

log = logging.getLogger("haqueue.messaging")

MAX_DELIVERIES = "x-max-deliveries"
# The annotations a poisoned message carries to the dead-letter address.
REASON = "x-opt-dead-letter-reason"
ORIGIN = "x-opt-dead-letter-queue"


def validate(kind: str, name: str, args: dict[str, Any]) -> str | None:
    """The registry's validator: x-max-deliveries on a queue, a whole number from 1."""
    if MAX_DELIVERIES not in args:
        return None
    value = args[MAX_DELIVERIES]
    if kind != "queue":
        return f"argument '{MAX_DELIVERIES}' is for queues"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"argument '{MAX_DELIVERIES}' must be a whole number >= 1, got {value!r}"
    return None


class DeliveryLimit:
    """A queue's redelivery_hook under x-max-deliveries."""

    def __init__(self, broker: Broker, limit: int) -> None:
        self.broker = broker
        self.limit = limit

    def __call__(self, queue: Queue, entry: Entry) -> bool:
        count = delivery_count(entry.data)
        if count < self.limit:
            return False
        reason = f"delivery-count {count} reached {MAX_DELIVERIES} {self.limit}"
        queue.poisoned += 1
        # Onto the dead-letter address first, then off this queue: a failover in between leaves it in both places,
        # never in neither.
        where = queue.dead_letter_address
        data = with_annotations(entry.data, {REASON: reason, ORIGIN: queue.name}) if where else None
        if self.broker.dead_letter(queue, entry, reason, data):
            log.info("queue %s: message seq %d moved to %s: %s", queue.name, entry.seq, where, reason)
        queue.dequeue(entry)
        return True


def install(broker: Broker) -> None:
    registry = broker.registry
    registry.validators.append(validate)

    def limit(queue: Queue) -> None:
        value = queue.args.get(MAX_DELIVERIES)
        if value:
            queue.redelivery_hook = DeliveryLimit(broker, int(value))
    registry.queue_hooks.append(limit)
