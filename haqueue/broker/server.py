"""Broker: listeners, connections, link attachment, dispatch, lifecycle.

Who may do what is `access` (access.py): checked here when a link attaches, and by the management node
for each request. Plug-ins (HA, the audit log) use the named hooks and nothing else:
`registry.observers` / `registry.validators` / `registry.queue_hooks` (wiring, and per-queue
observers, guards and `publish_refusal`: a queue closed to clients' publishes, whichever way they
come), `admission` (who may connect), `endpoints` (link handlers for `$`
addresses), `management.register` (operations, each with what it needs), `status_hooks` (fields of the broker status),
`completion_hooks` (a publisher's message confirmed), `link_routes` (a link served elsewhere: the shard
relay), `link_user` (whose rights a link's attach is checked against: the shard relay's links act for
their client), `flush_hooks` (the end of a loop pass, before
its output leaves), `durability` (a durable store: loads the wiring and messages it kept before anything
else happens, and says when what it was given is on disk) and `listener_tls` (a plug-in's own TLS for one
listener: HA's peer listener).
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import ssl
import uuid
from typing import Any, Callable, ContextManager, Protocol, Sequence

from .. import __version__
from .._compiled import hot_path_compiled
from ..config import BrokerConfig, LimitsConfig, ListenerConfig
from .access import RECEIVE, SEND, Access
from .connection import Connection
from .engine import Engine
from .errors import BrokerError, INVALID_FIELD, NOT_ALLOWED, NOT_IMPLEMENTED, RESOURCE_LOCKED, RecoveryError
from .exchange import Exchange
from .flow import BLOCK, MemoryAlarm
from .links import Consumer, Publisher
from .listener import Listener
from .management import ADDRESS as MANAGEMENT, Management
from .message import Routing
from .pass_end import Dispatchable, PassEnd
from .proton_adapter import Link, LinkHandler
from .queue import ConfirmHook, Entry, Queue
from .registry import Registry
from .selector import Selector, SelectorError, compile_selector, selector_filter
from .tls import server_context
from .transactions import Coordinator, Transactions

log = logging.getLogger("haqueue.broker")

Admission = Callable[[Connection], None]  # raises BrokerError to refuse


class Durability(Protocol):
    """A durable store, as the broker and its plug-ins see it (besides its guard on durable messages)."""

    def recover(self) -> None:
        """Load what was kept into the registry; raise RecoveryError if it cannot be read."""

    def after_sync(self, callback: Callable[[], None]) -> None:
        """Call back (on the broker's thread) once everything journalled so far is on disk."""

    def held(self) -> dict[str, int]:
        """What the journal holds: live messages, bytes, and bytes written but not yet synced."""

    def atomically(self) -> ContextManager[None]:
        """What is journalled within is recovered whole or not at all (a transaction's commit)."""


class Subscriptions(Protocol):
    """Subscriptions to an exchange that outlive a link or are shared by several (messaging/subscriptions.py)."""

    def subscribe(self, link: Link, exchange: Exchange, selector: Selector | None) -> Queue | None:
        """The queue a receiver on `exchange` consumes from, or None: a temporary queue of its own, as by default.
        The subscription applies the selector (its binding's): everything on its queue is for the receiver.
        Raises BrokerError to refuse the link."""

    def look_up(self, link: Link) -> Queue:
        """The subscription a receiver with no source at all names by its link name (Qpid JMS's unsubscribe); the
        link's source is set to describe it. Raises BrokerError if there is none."""


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.name = config.name
        self.pass_end = PassEnd()
        self.schedule: Callable[[Dispatchable], None] = self.pass_end.schedule
        self.memory = MemoryAlarm(config.limits.memory_limit)
        self.registry = Registry(config.auto_create, _queue_defaults(config.limits), self.schedule, self.memory)
        self.access = Access(config.users, config.anonymous)
        self.engine = Engine(self, self.pass_end, config.limits, config.name, self.access, self.access.anonymous)
        self.management = Management(self)
        self.admission: list[Admission] = []
        self.endpoints: dict[str, Callable[[Link], LinkHandler]] = {}
        # Asked, in order, for each client link to a named address once its access is checked, before the
        # address is resolved: a handler serving it elsewhere (the shard relay), or None to serve it here.
        self.link_routes: list[Callable[[Link], LinkHandler | None]] = []
        # Who a link acts for, whose rights its attach is checked against: its connection's user, unless a
        # plug-in knows better (a shard relay's link acts for the client it was relayed for).
        self.link_user: Callable[[Link], str | None] = lambda link: link.conn.user
        self.status_hooks: list[Callable[[dict[str, Any]], None]] = []
        # Called with (queue, entry) when a publisher's message is confirmed (the audit log).
        self.completion_hooks: list[ConfirmHook] = []
        self.flush_hooks = self.pass_end.flush_hooks
        self.connections: set[Connection] = set()
        self.durability: Durability | None = None  # set by a store plug-in
        self.subscriptions: Subscriptions | None = None  # durable and shared subscriptions (messaging/)
        self.transactions = Transactions(self)
        # A plug-in's TLS for the listener on (host, port), in place of the listener's own `tls`.
        self.listener_tls: dict[tuple[str, int], ssl.SSLContext] = {}
        self._tls: dict[bool, ssl.SSLContext] = {}  # the config's tls, by whether client certificates are required

    # -- set-up ------------------------------------------------------------------------------
    def declare_configured(self) -> None:
        """The queues, exchanges and bindings named in the config."""
        for q in self.config.queues:
            self.registry.declare_queue(q.name, dict(q.args))
        for x in self.config.exchanges:
            self.registry.declare_exchange(x.name, x.type, dict(x.args))
        for b in self.config.bindings:
            self.registry.resolve(b.queue)
            self.registry.bind(b.exchange, b.queue, b.key, dict(b.args))

    def _tls_context(self, options: ListenerConfig) -> ssl.SSLContext | None:
        context = self.listener_tls.get((options.host, options.port))
        if context is not None or not options.tls:
            return context
        assert self.config.tls is not None  # the config checked that a tls listener has a tls section
        required = options.require_client_cert
        if required not in self._tls:
            self._tls[required] = server_context(self.config.tls, required, "tls")
        return self._tls[required]

    def listen(self, options: ListenerConfig) -> None:
        """Open a listener (at start, or later: HA binds the public address on promotion)."""
        context = self._tls_context(options)
        listener = Listener(options, context)
        self.engine.listen(listener)
        tls = "" if context is None else " (TLS, client certificates required)" \
            if context.verify_mode == ssl.CERT_REQUIRED else " (TLS)"
        log.info("listening on %s:%s%s", options.host, options.port, tls)

    # -- engine events -----------------------------------------------------------------------
    def connection_opened(self, conn: Connection) -> None:
        for admit in self.admission:
            admit(conn)
        conn.attachment = True
        self.connections.add(conn)
        log.debug("connection %s from %s (user %s)", conn.remote_container, conn.peer, conn.user)

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)

    def link_opened(self, link: Link) -> LinkHandler:
        if link.coordinator:
            return Coordinator(self.transactions, link)
        address = link.address
        special = self._special_endpoint(address)
        if special is not None:
            return special(link)
        # A dynamic node is the client's own, whoever it is; any other address is checked before it is
        # resolved, which may auto-create it.
        user = self.link_user(link)
        if not link.is_sender:  # the client publishes
            if link.dynamic:
                queue = self._temporary_queue()
                link.address = queue.name
                return Publisher(self, link, queue)
            if not address:  # the anonymous relay: each message's `to` is checked
                return Publisher(self, link, None, self.access.relay(user))
            self.access.check(user, SEND, address)
            return self._routed(link) or Publisher(self, link, self.registry.resolve(address))
        # the client consumes
        selector = self._selector(link)
        owns = subscribed = False
        if link.dynamic:
            queue = self._temporary_queue()
            link.address = queue.name
            owns = True
        elif not address:
            if not link.source_unspecified or self.subscriptions is None:
                raise BrokerError(INVALID_FIELD, "a receiving link needs a source address (or dynamic)")
            queue = self.subscriptions.look_up(link)
            subscribed = True
        else:
            self.access.check(user, RECEIVE, address)
            routed = self._routed(link)
            if routed is not None:
                return routed
            node = self.registry.resolve(address)
            if isinstance(node, Exchange):
                found = self.subscriptions.subscribe(link, node, selector) if self.subscriptions is not None else None
                if found is None:
                    queue, owns = self._subscription_queue(node, selector is not None and not link.browse), True
                else:  # its binding applies the selector: everything on its queue is for the receiver
                    queue, subscribed, selector = found, True, None
            else:
                queue = node
        if selector is not None and not link.browse and queue.arranger is not None and queue.arranger.picks:
            raise BrokerError(NOT_IMPLEMENTED, f"queue '{queue.name}' orders its messages itself (x-priorities or "
                                               f"x-group-header): a consumer with a selector cannot take from it "
                                               f"(a browser can)")
        if queue.exclusive and not link.browse and (queue.consumers or queue.browsers):
            raise BrokerError(RESOURCE_LOCKED, f"queue '{queue.name}' is exclusive and already has a consumer")
        consumer = Consumer(self, link, queue, link.browse, owns, selector)
        consumer.closing_ends = subscribed
        queue.subscribe(consumer)
        return consumer

    def _routed(self, link: Link) -> LinkHandler | None:
        for route in self.link_routes:
            handler = route(link)
            if handler is not None:
                return handler
        return None

    @staticmethod
    def _selector(link: Link) -> Selector | None:
        """The link's selector filter compiled, and marked to be echoed in the attach; an invalid one refused
        (amqp:invalid-field, naming the error and where it is). Other filters are not applied, nor echoed."""
        try:
            found = selector_filter(link.source_filters)
        except SelectorError as e:
            raise BrokerError(INVALID_FIELD, f"invalid selector filter: {e.message}") from None
        if found is None:
            return None
        key, text = found
        try:
            selector = compile_selector(text)
        except SelectorError as e:
            raise BrokerError(INVALID_FIELD, f"invalid selector {text!r}: {e}") from None
        link.honoured_filters = {key: link.source_filters[key]}
        return selector

    def _special_endpoint(self, address: str | None) -> Callable[[Link], LinkHandler] | None:
        if not address or not address.startswith("$"):
            return None
        if address == MANAGEMENT:
            return self.management.endpoint
        for prefix, factory in self.endpoints.items():
            if address == prefix or address.startswith(prefix + "/"):
                return factory
        return None

    def _temporary_queue(self, name: str | None = None) -> Queue:
        """A queue that lives as long as the link it was made for (never replicated: the link cannot fail over)."""
        queue = self.registry.declare_queue(name or f"amq.tmp.{uuid.uuid4().hex}", {"auto-delete": True},
                                            temporary=True)[0]
        return queue

    def _subscription_queue(self, exchange: Exchange, selective: bool) -> Queue:
        """A private queue bound to an exchange for a client that consumes from the exchange itself. `selective`:
        it consumes with a selector, and what that does not match would stay there for good: dropped instead."""
        queue = self._temporary_queue(f"{exchange.name}.sub.{uuid.uuid4().hex[:12]}")
        queue.discard_unmatched = selective
        self.registry.bind(exchange.name, queue.name, subscription_key(exchange), {})
        return queue

    def atomically(self) -> ContextManager[None]:
        """What is journalled within is recovered whole or not at all (without a store, nothing to do)."""
        return self.durability.atomically() if self.durability is not None else contextlib.nullcontext()

    # -- routing for the broker's own messages -----------------------------------------------
    def deliver(self, address: str, data: bytes) -> None:
        """Route a message the broker itself makes (management answers, dead letters)."""
        data = bytes(data)  # proton's Message.encode gives a bytearray; queues hold bytes
        node = self.registry.resolve(address)
        queues = node.route(Routing(data).key, data) if isinstance(node, Exchange) else [node]
        for queue in queues:
            closed = queue.closed()
            if closed:  # a reply-to or dead-letter address is no way around a queue closed to clients
                raise BrokerError(NOT_ALLOWED, closed)
        for queue in queues:
            queue.enqueue(data, 0.0)

    def dead_letter(self, queue: Queue, entry: Entry, why: str, data: bytes | None = None) -> bool:
        """A message leaving `queue` because `why`: onto the queue's dead-letter address (`data`: its bytes as they
        go, by default the entry's); else dropped, logged. Whether it went."""
        where = queue.dead_letter_address
        if not where:
            log.info("queue %s: message seq %d dropped: %s, and the queue has no dead_letter_address", queue.name,
                     entry.seq, why)
            return False
        try:
            self.deliver(where, entry.data if data is None else data)
            return True
        except BrokerError as e:
            log.warning("queue %s: message seq %d dropped (%s), not dead-lettered to %s: %s", queue.name, entry.seq,
                        why, where, e.description)
            return False

    # -- status and lifecycle ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"name": self.name, "role": "standalone", "state": "active",
                                  "queues": len(self.registry.queues()), "connections": len(self.connections),
                                  "memory_used": self.memory.used, "memory_limit": self.memory.configured,
                                  "memory_alarm": self.memory.on, "version": __version__}
        for hook in self.status_hooks:
            hook(status)
        return status

    def start(self) -> None:
        os.makedirs(self.config.data_dir, exist_ok=True)
        if self.durability is not None:
            self.durability.recover()
        self.declare_configured()
        for options in self.config.listen:
            self.listen(options)
        self.engine.every(1.0, self._expire)

    def _expire(self) -> None:
        for queue in self.registry.queues():
            queue.expire()

    def run(self) -> None:
        self.engine.run()
        self.engine.shutdown()


def subscription_key(exchange: Exchange) -> str:
    """The binding key of a subscription to the exchange itself: every message of a topic exchange."""
    return "#" if exchange.type == "topic" else ""


def _queue_defaults(limits: LimitsConfig) -> dict[str, Any]:
    """The queue arguments the limits set for queues that do not give them: those that differ from a
    queue's own defaults (no limit, overflow block)."""
    defaults = {"max_depth": limits.max_depth, "max_bytes": limits.max_bytes, "overflow": limits.overflow}
    return {key: value for key, value in defaults.items() if value not in (0, BLOCK)}


GC_THRESHOLD = 50_000  # allocations of tracked objects between young-generation collections (default 700)


def run(config: BrokerConfig, plugins: Sequence[Callable[[Broker], Any]] = ()) -> int:
    """Run a broker in the foreground until SIGTERM or SIGINT; the exit code.
    Each plug-in (the store, HA, the audit log) is called with the broker to attach its hooks before it
    starts: a store recovers, then the configured wiring is declared and the listeners open."""
    broker = Broker(config)
    try:
        for plugin in plugins:
            plugin(broker)
        broker.start()
    except RecoveryError as e:
        log.error("cannot start: %s", e)
        return 2
    except (OSError, BrokerError) as e:
        log.error("cannot start: %s", e)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: broker.engine.stop())
    # The hot path makes a few objects per message (entries, confirmations) that live until consumed and
    # form no cycles; with the default thresholds the cyclic collector ran every 700 of them and walked the
    # survivors again and again (a durable publish paid ~1 µs for it). What start-up made is frozen out of
    # its sight, and it runs rarely: cycles (closed connections' handlers) are still collected.
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)
    log.info("broker %s running (hot path %s)", config.name, "compiled" if hot_path_compiled() else "from source")
    broker.run()
    log.info("broker %s stopped", config.name)
    return 0
