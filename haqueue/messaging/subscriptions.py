"""Durable and shared subscriptions to an exchange (AMQP 1.0 3.5.3 terminus durability; JMS 2.0 shared subscriptions
as Qpid JMS maps them onto AMQP): a receiver on an exchange whose source asks for it consumes from a named queue
that outlives its link, or that several receivers share, instead of a temporary queue of its own
(design/messaging.md, "Durable and shared subscriptions").

- durable: source durability configuration or unsettled-state with expiry-policy never. The queue is an ordinary
  queue (replicated, journalled) that survives detach, the connection's end and a failover; a detach with
  closed=true (JMS unsubscribe) deletes it once no other receiver consumes from it.
- shared: source capability `shared`; several receivers consume from one queue. Without durability it is
  temporary and lives while one of them is attached.
- global: source capability `global`; the name is not scoped by the client's container-id.

The queue's name comes from the container-id and the link name, as ActiveMQ Artemis names its AMQP
subscriptions, with ':' after the container-id: `<container>:<link>`, `<link>:global`, and for a shared one the
link name up to its first '|' (Qpid JMS names a subscription's further links `name|2`, `name|volatile1`...), a
non-durable one ending in `:shared-volatile`. What a subscription is lives in its queue's arguments (so a backup
and a restarted broker know it too): `x-subscription` (its exchange), `x-subscription-selector`, and for one
scoped by container `x-subscription-container` and `x-subscription-user` (who made it: no one else may resume it).
"""
from __future__ import annotations

import logging
from typing import Any

from proton import Described, symbol, ulong

from ..broker.access import RECEIVE
from ..broker.errors import NOT_FOUND, NOT_IMPLEMENTED, RESOURCE_LOCKED, UNAUTHORIZED, BrokerError
from ..broker.exchange import SELECTOR as BINDING_SELECTOR, Exchange
from ..broker.proton_adapter import Link
from ..broker.queue import Queue
from ..broker.selector import SELECTOR_DESCRIPTORS, Selector
from ..broker.server import Broker, subscription_key

log = logging.getLogger("haqueue.messaging")

EXCHANGE = "x-subscription"
SELECTOR = "x-subscription-selector"
CONTAINER = "x-subscription-container"
USER = "x-subscription-user"
# What a subscription is, beyond whose (checked first): attached with others, it is made anew (or refused while in use).
DEFINING = (EXCHANGE, SELECTOR, "exclusive")
SHARED = "shared"
GLOBAL = "global"
SHARED_SUBS = "SHARED-SUBS"  # offered at open: Qpid JMS then creates shared subscriptions without asking per link
SELECTOR_DESCRIPTOR = ulong(SELECTOR_DESCRIPTORS[1])  # apache.org:selector-filter:string's code, as Qpid JMS sends it


def queue_name(container: str, link_name: str, durable: bool, shared: bool, global_: bool) -> str:
    """The subscription queue's name (module docstring)."""
    name = link_name.split("|", 1)[0] if shared else link_name
    if not global_:
        name = f"{container}:{name}"
    if not durable:
        name += ":shared-volatile"
    return name + ":global" if global_ else name


def validate(kind: str, name: str, args: dict[str, Any]) -> str | None:
    """The registry's validator: the subscription arguments on a queue, each a string."""
    for key in (EXCHANGE, SELECTOR, CONTAINER, USER):
        if key in args:
            if kind != "queue":
                return f"argument '{key}' is for queues"
            if not isinstance(args[key], str):
                return f"argument '{key}' must be a string, got {args[key]!r}"
    return None


class Subscriptions:
    """The broker's `subscriptions` (server.Subscriptions)."""

    def __init__(self, broker: Broker, sharded: bool) -> None:
        self.broker = broker
        self.registry = broker.registry
        self.sharded = sharded

    def subscribe(self, link: Link, exchange: Exchange, selector: Selector | None) -> Queue | None:
        capabilities = link.source_capabilities
        shared, global_ = SHARED in capabilities, GLOBAL in capabilities
        asked_durable = link.source_durability != 0
        durable = asked_durable and link.source_expires_never
        if asked_durable and not durable:  # the attach must not promise what a temporary queue cannot keep
            link.describe_source(exchange.name, False, capabilities)
        if not (durable or shared):
            return None
        if self.sharded:
            raise BrokerError(NOT_IMPLEMENTED, "durable and shared subscriptions are not available in a sharded "
                                               "cluster: subscribe without them (a temporary subscription)")
        name = queue_name(link.remote_container, link.name, durable, shared, global_)
        args = self._arguments(link, exchange, selector, shared, global_)
        found = self.registry.lookup(name)
        queue = found if isinstance(found, Queue) else None
        if queue is not None:
            self._check(queue, name, link, global_)
            if _defining(queue.args) != _defining(args):
                self._replace(queue, exchange, selector)
                queue = None
        if queue is None:  # (an exchange of the name refuses it)
            if not durable:
                args["auto-delete"] = True  # a shared volatile subscription: while one of its receivers is attached
            queue = self.registry.declare_queue(name, args, temporary=not durable)[0]
            log.info("subscription %s to %s made%s", name, exchange.name,
                     f" (selector {selector.text!r})" if selector is not None else "")
        # bound again each time: the exchange may have been deleted and declared again since. The binding applies
        # the selector: what it does not match never reaches the queue, attached or not.
        binding = {BINDING_SELECTOR: selector.text} if selector is not None else {}
        self.registry.bind(exchange.name, queue.name, subscription_key(exchange), binding)
        link.browse = False  # consumed: Qpid JMS asks for distribution-mode copy on durable ones (Artemis ignores it)
        return queue

    def look_up(self, link: Link) -> Queue:
        subscription, _, suffix = link.name.partition("|")
        global_ = suffix.startswith(GLOBAL)  # Qpid JMS names a global subscription's link `name|global`
        name = queue_name(link.remote_container, subscription, True, False, global_)
        queue = self.registry.lookup(name)
        if not isinstance(queue, Queue) or queue.temporary or EXCHANGE not in queue.args:
            raise BrokerError(NOT_FOUND, f"no durable subscription named '{subscription}'"
                                         f"{'' if global_ else f' for container {link.remote_container!r}'}")
        self._check(queue, name, link, global_)
        exchange = str(queue.args[EXCHANGE])
        self.broker.access.check(self.broker.link_user(link), RECEIVE, exchange)
        if SELECTOR in queue.args:
            link.honoured_filters = {symbol("jms-selector"): Described(SELECTOR_DESCRIPTOR, queue.args[SELECTOR])}
        capabilities = ["topic"] + ([] if queue.exclusive else [SHARED]) + ([GLOBAL] if global_ else [])
        link.describe_source(exchange, True, capabilities)
        link.browse = False
        return queue

    def _arguments(self, link: Link, exchange: Exchange, selector: Selector | None, shared: bool,
                   global_: bool) -> dict[str, Any]:
        args: dict[str, Any] = {EXCHANGE: exchange.name}
        if selector is not None:
            args[SELECTOR] = selector.text
        if not global_:
            args[CONTAINER] = link.remote_container
            user = self.broker.link_user(link)
            if user is not None:
                args[USER] = user
        if not shared:
            args["exclusive"] = True  # one receiver at a time, as JMS has an unshared durable subscription
        return args

    def _check(self, queue: Queue, name: str, link: Link, global_: bool) -> None:
        """Refuse a queue of the subscription's name that is not this link's subscription (names may clash: a
        container-id may hold ':'), or is another user's."""
        args = queue.args
        if EXCHANGE not in args or args.get(CONTAINER) != (None if global_ else link.remote_container):
            raise BrokerError(RESOURCE_LOCKED, f"queue '{name}' exists and is not this link's "
                                               f"{'global ' if global_ else ''}subscription")
        if not global_ and args.get(USER) != self.broker.link_user(link):
            raise BrokerError(UNAUTHORIZED, f"subscription '{name}' belongs to another user")

    def _replace(self, queue: Queue, exchange: Exchange, selector: Selector | None) -> None:
        """A subscription attached with another exchange or selector (or shared where it was not) is made anew, as
        JMS has it and Artemis does: what the old one held is dropped. Refused while a receiver consumes from it."""
        what = f"exchange '{exchange.name}'" + (f" and selector {selector.text!r}" if selector is not None else "")
        was = f"exchange '{queue.args[EXCHANGE]}'" + (f" and selector {queue.args[SELECTOR]!r}"
                                                       if SELECTOR in queue.args else "")
        if queue.consumers or queue.browsers:
            raise BrokerError(RESOURCE_LOCKED, f"subscription '{queue.name}' is in use with {was}: it cannot be "
                                               f"changed to {what} while a receiver is attached")
        log.info("subscription %s replaced: %s, was %s (%d messages dropped)", queue.name, what, was, queue.depth)
        self.registry.delete(queue.name)


def _defining(args: dict[str, Any]) -> dict[str, Any]:
    return {key: args[key] for key in DEFINING if key in args}


def install(broker: Broker, sharded: bool) -> None:
    broker.registry.validators.append(validate)
    broker.subscriptions = Subscriptions(broker, sharded)
    broker.engine.offered_capabilities.append(SHARED_SUBS)
