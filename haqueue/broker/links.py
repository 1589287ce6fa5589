"""The broker's end of client links: publishers (the client sends) and consumers/browsers (the
broker sends). The hot path lives here: a message in, a message out, an outcome."""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from .completion import Completion
from .errors import DECODE, BrokerError, INVALID_FIELD, NOT_ALLOWED, NOT_FOUND, RESOURCE_DELETED, RESOURCE_LIMIT
from .exchange import Exchange
from .flow import BLOCK, DROP_HEAD, REJECT_PUBLISH, Blocker, MemoryAlarm
from .message import MalformedMessage, Routing, is_durable, is_message, ttl_ms
from .proton_adapter import ACCEPTED, MODIFIED, REJECTED, RELEASED, Link, LinkHandler
from .queue import ConfirmHook, Entry, Queue, Returned
from .registry import Registry
from .selector import Selector
from .transactions import Transactions


class LinkHost(Protocol):
    """What a link needs of the broker that made it (server.Broker): the links never import the broker."""

    completion_hooks: list[ConfirmHook]
    memory: MemoryAlarm
    registry: Registry
    transactions: Transactions

    def schedule(self, item: Queue) -> None:
        """Dispatch the queue at the end of this pass."""

    def dead_letter(self, queue: Queue, entry: Entry, why: str, data: bytes | None = None) -> bool:
        """A message leaving `queue` because `why`: to the queue's dead-letter address, or dropped; whether it went."""


class Publisher(LinkHandler):
    """A client's sending link, bound to a queue, an exchange, or nothing (anonymous relay: route by `to`).

    Flow control (flow.py): a publish over a queue's limits or the broker's memory_limit meets the
    queue's overflow policy; `block` accepts it and holds the link's credit until every cause lifts."""

    def __init__(self, broker: LinkHost, link: Link, node: Queue | Exchange | None,
                 may_send: Callable[[str], None] | None = None) -> None:
        self.broker = broker
        self.link = link
        self.node = node
        self.may_send = may_send  # the anonymous relay's check of each `to` (raises BrokerError); None: any
        self.completion_hooks = broker.completion_hooks
        self.memory = broker.memory
        self.holds: set[Blocker] = set()  # what this link's credit waits on
        self._hold_at_attach()

    def _hold_at_attach(self) -> None:
        """A publisher that attaches to a blocked queue, or during the memory alarm, gets no credit yet;
        else each new link could add a credit window to a queue that is already over its limit."""
        node = self.node
        blocks = not isinstance(node, Queue) or node.overflow == BLOCK
        if isinstance(node, Queue) and blocks and (node.blocker.held or not node.fits(0)):
            self._hold(node.blocker)
        if self.memory.on and blocks:
            self._hold(self.memory)

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        if not is_message(data):
            self.link.settle(delivery, REJECTED, DECODE, "the transfer is not an AMQP message (no section descriptor)")
            return
        node = self.node
        if type(node) is Queue and not node.deleted and node.fits(len(data)) and not self.memory.on:
            # The hot path: one queue, within its limits. The header is read once (durable, ttl).
            durable = bool(node.journals) and is_durable(data)
            if not (durable and node.refusal(True)):
                ttl = ttl_ms(data)
                expiry = time.monotonic() + ttl / 1000.0 if ttl else 0.0
                if settled or not (durable or node.guards):
                    entry = node.enqueue(data, expiry, durable=durable)
                    self.link.settle(delivery, 0 if settled else ACCEPTED)
                    if self.completion_hooks and not settled:
                        self._completed(node, entry)
                    return
                confirmation = _Confirmation(self, delivery)
                confirmation.enqueued.append((node, node.enqueue(data, expiry, confirmation, durable=durable)))
                confirmation.release()
                return
        durable = is_durable(data)
        try:
            queues = self.queues_for(data, durable)
            self._overflow(queues, len(data))
        except BrokerError as e:
            self.link.settle(delivery, REJECTED, e.condition, e.description)
            return
        except MalformedMessage as e:
            self.link.settle(delivery, REJECTED, DECODE, str(e))
            return
        ttl = ttl_ms(data)
        expiry = time.monotonic() + ttl / 1000.0 if ttl else 0.0
        if settled or not any(q.guards or (durable and q.journals) for q in queues):
            enqueued = [(queue, queue.enqueue(data, expiry, durable=durable)) for queue in queues]
            self.link.settle(delivery, 0 if settled else ACCEPTED)
            if not settled:
                for queue, entry in enqueued:
                    self._completed(queue, entry)
            return
        confirmation = _Confirmation(self, delivery)
        for queue in queues:
            confirmation.enqueued.append((queue, queue.enqueue(data, expiry, confirmation, durable=durable)))
        confirmation.release()

    def on_txn_message(self, delivery: Any, data: bytes, settled: bool, txn_id: bytes) -> bool:
        self.broker.transactions.publish(self, delivery, data, settled, txn_id)
        return True

    def queues_for(self, data: bytes, durable: bool) -> list[Queue]:
        """Where a publish goes; raises BrokerError if it cannot go there (a queue closed to clients, or refusing
        durable messages)."""
        node = self.node
        queues = [node] if type(node) is Queue and not node.deleted else self._route(node, data)
        for queue in queues:
            closed = queue.closed()
            if closed:
                raise BrokerError(NOT_ALLOWED, closed)
            refusal = queue.refusal(durable)
            if refusal:
                raise BrokerError(RESOURCE_LIMIT, refusal)
        return queues

    def _overflow(self, queues: list[Queue], size: int) -> None:
        """Apply the overflow policy of each queue this publish would take over a limit: reject the
        publish (raises before anything is enqueued), drop heads, or hold this link's credit."""
        alarm = self.memory.on
        over = [q for q in queues if alarm or not q.fits(size)]
        for queue in over:
            if queue.overflow == REJECT_PUBLISH:
                raise BrokerError(RESOURCE_LIMIT, queue.over_limit(size) if not queue.fits(size) else
                                  f"queue '{queue.name}' refuses publishes while the broker is over its "
                                  f"memory_limit ({self.memory.configured} bytes)")
        for queue in over:
            if queue.overflow == DROP_HEAD:
                queue.drop_head(size, alarm)
                continue
            if not queue.fits(size):
                self._hold(queue.blocker)
            if alarm:
                self._hold(self.memory)

    def _hold(self, blocker: Blocker) -> None:
        if not self.holds:
            self.link.hold_credit()
        self.holds.add(blocker)
        blocker.held.add(self)

    def lifted(self, blocker: Blocker) -> None:
        self.holds.discard(blocker)
        if not self.holds:
            self.link.resume_credit()

    def on_detach(self) -> None:
        for blocker in self.holds:
            blocker.held.discard(self)
        self.holds.clear()

    def _completed(self, queue: Queue, entry: Entry) -> None:
        for hook in self.completion_hooks:
            hook(queue, entry)

    def _route(self, node: Queue | Exchange | None, data: bytes) -> list[Queue]:
        if isinstance(node, Exchange):
            return node.route(Routing(data).key, data)
        if node is not None:  # a queue deleted under an attached publisher
            raise BrokerError(NOT_FOUND, f"queue '{node.name}' has been deleted")
        routing = Routing(data)
        if not routing.to:
            raise BrokerError(INVALID_FIELD, "anonymous relay needs the message's 'to' address")
        if self.may_send is not None:
            self.may_send(routing.to)
        target = self.broker.registry.resolve(routing.to)
        return target.route(routing.key, data) if isinstance(target, Exchange) else [target]


class _Confirmation(Completion):
    """A publish waiting for its guards (HA's backups, a store's sync): accepted once all release it."""

    __slots__ = ("publisher", "delivery", "enqueued")

    def __init__(self, publisher: Publisher, delivery: Any) -> None:
        self.pending = 1  # the publisher's own hold, released once routing is done
        self.publisher = publisher
        self.delivery = delivery
        self.enqueued: list[tuple[Queue, Entry]] = []

    def complete(self) -> None:
        publisher = self.publisher
        if publisher.link.closed:
            return
        publisher.link.settle(self.delivery, ACCEPTED)
        for queue, entry in self.enqueued:
            publisher._completed(queue, entry)


class Consumer(LinkHandler):
    """A client's receiving link on a queue: acquires (or, as a browser, copies) messages, all of them or
    those its selector matches.

    Deliveries are settled as the link's snd-settle-mode says, a browser's as a consumer's: pre-settled
    only if the client asked for that (`settled`); else unsettled, and the client's outcome settles them.
    A browser's outcome never touches the queue. (Browsing once sent pre-settled whatever the mode, which
    an `unsettled` link forbids and which proton's BlockingReceiver cannot accept: its accept() looks for
    an unsettled delivery and raises.)"""

    def __init__(self, broker: LinkHost, link: Link, queue: Queue, browse: bool, owns_queue: bool,
                 selector: Selector | None = None) -> None:
        self.broker = broker
        self.link = link
        self.queue = queue
        self.browse = browse
        self.selector = selector
        self.cursor = 0  # a browser's or selector consumer's place in the queue (queue.py)
        self.returned: list[Returned] = []  # a selector consumer's released entries (queue.py)
        self.owns_queue = owns_queue  # a dynamic or private queue that goes with this link
        # a subscription's queue (messaging/subscriptions.py): it ends when its last consumer's link is closed,
        # not merely detached (JMS unsubscribe)
        self.closing_ends = False
        self.presettled = link.settle_first
        self.unsettled: dict[Any, Entry] = {}

    def credit(self) -> int:
        link = self.link
        if link.closed or link.output_full():
            return 0  # a peer that does not read its socket gets nothing more until it has read
        return link.credit()

    def deliver(self, entry: Entry) -> None:
        if self.presettled:
            self.link.send(entry.data, settled=True)
            if not self.browse:
                self.queue.dequeue(entry)
        elif self.browse:
            self.link.send(entry.data)  # its outcome is ignored (on_outcome knows no entry for it)
        else:
            self.unsettled[self.link.send(entry.data)] = entry

    def after_dispatch(self) -> None:
        if self.link.credit():
            self.link.drained()

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        entry = self.unsettled.pop(delivery, None)
        if entry is None:
            return
        queue = self.queue
        if outcome == ACCEPTED:
            queue.dequeue(entry)
        elif outcome == RELEASED:
            queue.release(entry)
        elif outcome == MODIFIED:
            queue.release(entry, failed=failed)
        elif outcome == REJECTED:
            queue.dequeue(entry)
            if self.broker.dead_letter(queue, entry, "rejected by its consumer"):
                queue.dead_lettered += 1
        else:
            queue.release(entry)

    def on_txn_outcome(self, delivery: Any, txn_id: bytes, outcome: int) -> None:
        self.broker.transactions.outcome(self, delivery, txn_id, outcome)

    def on_credit(self) -> None:
        self.broker.schedule(self.queue)

    def queue_deleted(self) -> None:
        self.unsettled.clear()
        self.link.close(RESOURCE_DELETED, f"queue '{self.queue.name}' was deleted")

    def on_detach(self) -> None:
        """Unsettled messages go back to the queue as failed deliveries (delivery-count + 1)."""
        queue = self.queue
        queue.unsubscribe(self)
        for entry in self.unsettled.values():
            queue.release(entry, failed=True)
        self.unsettled.clear()
        ends = self.owns_queue or queue.auto_delete or (self.closing_ends and self.link.remote_closed)
        if ends and not queue.deleted and not queue.consumers and not queue.browsers:
            self.broker.registry.delete(queue.name)
