"""Messaging semantics beyond a plain queue that Qpid, Artemis and JMS applications rely on (issue 28), each
plugged into the core through its named hooks (the registry's validators and queue_hooks, a queue's
redelivery_hook), so that a queue that does not use one pays nothing for it:

- poison.py   x-max-deliveries: a message that failed delivery too often goes to the dead-letter address.
"""
from __future__ import annotations

from ..broker.server import Broker
from . import poison


def install(broker: Broker) -> None:
    """Plug every feature of this package into the broker (each does nothing for a queue without its argument)."""
    poison.install(broker)
