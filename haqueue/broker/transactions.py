"""Local transactions (AMQP 1.0 part 4, design/transactions.md): a client's coordinator link declares
and discharges them; transfers and outcomes that name one wait in it until it is discharged.

A transaction holds its publishes (routed and checked when they arrive, enqueued at commit) and its
consumers' outcomes (the messages stay acquired, applied at commit). Commit applies all of it in one
go on the broker's loop, so no consumer or browser ever sees part of it, and asks the durable store to
journal its records as one group that recovery keeps whole or not at all. The discharge is accepted
once every guard of every message it enqueued has released it: on disk, and on the backups HA asks for.
Rollback drops the publishes and releases the messages. A transaction lives as long as its controller
link: a lost connection or a broker that stops (a failover) rolls it back.

A plug-in may do a transaction's work elsewhere (the shard relay: at another shard's primary). It sets
`Transaction.elsewhere`, a `Participant` that is handed the discharge; work under it here is then refused,
as there is no two-phase commit (`mixed`).
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Callable, ContextManager, Protocol

from proton import Described, Message, symbol, ulong

from .completion import Completion
from .connection import Connection
from .errors import DECODE, NOT_IMPLEMENTED, TXN_ROLLBACK, TXN_UNKNOWN, BrokerError
from .message import MalformedMessage, expiry, is_durable, is_message
from .proton_adapter import ACCEPTED, DECLARED, REJECTED, RELEASED, TRANSACTIONAL, Link, LinkHandler
from .queue import ConfirmHook, Entry, Queue

log = logging.getLogger("haqueue.transactions")

_DECLARE = {symbol("amqp:declare:list"), 0x31}
_DISCHARGE = {symbol("amqp:discharge:list"), 0x32}
_ACCEPTED_STATE = Described(ulong(ACCEPTED), [])


class CommitObserver(Protocol):
    """Told of a commit as it is applied (HA replicates it as one): `committing` before its enqueues and
    dequeues, `committed` after, with every queue they touch."""

    def committing(self, number: int, queues: list[Queue]) -> None: ...
    def committed(self, number: int, queues: list[Queue]) -> None: ...


class Participant(Protocol):
    """Where a transaction's work is done when not in this broker: its `name` ("shard 1") for refusals."""

    name: str

    def discharge(self, fail: bool, done: Callable[[str | None, str], None]) -> None:
        """Commit there (roll back if `fail`); then `done(None, "")`, or `done(condition, description)`
        when it was not committed."""
        ...


class TransactionHost(Protocol):
    """What transactions need of the broker (server.Broker)."""

    name: str
    completion_hooks: list[ConfirmHook]

    def atomically(self) -> ContextManager[None]:
        """What is journalled within is recovered whole or not at all."""


class TransactedPublisher(Protocol):
    """A client's sending link (links.Publisher) that published under a transaction."""

    @property
    def link(self) -> Link: ...

    def queues_for(self, data: bytes, durable: bool) -> list[Queue]:
        """Where the message goes (raises BrokerError if nowhere may take it)."""


class TransactedConsumer(Protocol):
    """A consumer (links.Consumer) whose client settled a message under a transaction."""

    @property
    def link(self) -> Link: ...

    @property
    def queue(self) -> Queue: ...

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        """Apply the client's outcome to the message it names."""


class Transaction:
    def __init__(self, txn_id: bytes, number: int, controller: Link) -> None:
        self.id = txn_id
        self.number = number  # unique in this broker process
        self.controller = controller
        self.publishes: list[tuple[list[Queue], bytes, float, bool]] = []  # queues, message, expiry, durable
        self.outcomes: list[tuple[TransactedConsumer, int, int]] = []  # consumer, delivery, outcome
        self.doomed: str | None = None  # why it can only roll back (a publish refused in it)
        self.elsewhere: Participant | None = None  # where its work is done, if not here (a plug-in's)

    @property
    def has_work_here(self) -> bool:
        return bool(self.publishes or self.outcomes)


class Transactions:
    """The broker's transactions, by id. Ids name this broker process, so that a discharge reaching a
    broker that does not know the transaction says whether it was lost with another (rolled back) or
    never existed here."""

    def __init__(self, broker: TransactionHost) -> None:
        self.broker = broker
        self.active: dict[bytes, Transaction] = {}
        self.observers: list[CommitObserver] = []
        self.prefix = f"{broker.name}:{os.getpid()}:{int(time.time())}:".encode()
        self.here = "this broker"  # this broker as a participant, in refusals (the shard plugin: "shard 0")
        self._numbers = itertools.count(1)

    def declare(self, controller: Link) -> Transaction:
        number = next(self._numbers)
        txn = Transaction(self.prefix + str(number).encode(), number, controller)
        self.active[txn.id] = txn
        return txn

    def find(self, txn_id: bytes, conn: Connection) -> Transaction:
        txn = self.active.get(txn_id)
        if txn is not None and txn.controller.conn is conn:
            return txn
        name = txn_id.decode("utf-8", "replace")
        if txn_id.startswith(self.prefix):
            raise BrokerError(TXN_UNKNOWN, f"transaction '{name}' is unknown on this connection "
                                           f"(discharged already, or declared on another connection)")
        raise BrokerError(TXN_ROLLBACK, f"transaction '{name}' was rolled back: the broker process that "
                                        f"held it stopped (a restart or a failover)")

    @staticmethod
    def mixed(txn: Transaction, first: str, second: str) -> str:
        """Why work on `second` cannot join `txn`, whose work is on `first`."""
        return (f"transaction '{txn.id.decode('utf-8', 'replace')}' has its work on {first}; work on {second} "
                f"cannot join it: a transaction's work must all be on one broker (there is no two-phase commit)")

    # -- work under a transaction -----------------------------------------------------------------
    def publish(self, publisher: TransactedPublisher, delivery: int, data: bytes, settled: bool, txn_id: bytes) -> None:
        link = publisher.link
        txn: Transaction | None = None
        try:
            txn = self.find(txn_id, link.conn)
            if txn.elsewhere is not None:  # refused alone: the transaction stays good for its participant
                link.settle(delivery, REJECTED, NOT_IMPLEMENTED, self.mixed(txn, txn.elsewhere.name, self.here))
                return
            if not is_message(data):
                raise BrokerError(DECODE, "the transfer is not an AMQP message (no section descriptor)")
            durable = is_durable(data)
            queues = publisher.queues_for(data, durable)
        except (BrokerError, MalformedMessage) as e:
            condition, description = (e.condition, e.description) if isinstance(e, BrokerError) else (DECODE, str(e))
            if txn is not None:  # a publish it promised cannot be kept: it can only roll back now
                txn.doomed = txn.doomed or f"a message sent in it was refused ({condition}: {description})"
            link.settle(delivery, REJECTED, condition, description)
            return
        txn.publishes.append((queues, data, expiry(data), durable))
        if settled:
            link.settle(delivery, 0)
        else:
            link.settle_with_state(delivery, TRANSACTIONAL, [txn.id, _ACCEPTED_STATE])

    def outcome(self, consumer: TransactedConsumer, delivery: int, txn_id: bytes, outcome: int) -> None:
        try:
            txn = self.find(txn_id, consumer.link.conn)
        except BrokerError as e:  # the message stays acquired; it goes back when the link does
            log.warning("outcome under transaction on link '%s' ignored: %s", consumer.link.name, e.description)
            return
        if txn.elsewhere is not None:  # an outcome has no answer of its own: the commit will say it
            txn.doomed = txn.doomed or self.mixed(txn, txn.elsewhere.name, self.here)
        txn.outcomes.append((consumer, delivery, outcome))  # released at rollback

    # -- discharge ---------------------------------------------------------------------------------
    def commit(self, txn: Transaction, done: Callable[[], None]) -> None:
        """Apply it at once; `done` once everything it enqueued is as safe as a confirmed publish."""
        del self.active[txn.id]
        enqueued: list[tuple[Queue, Entry]] = []

        def confirmed() -> None:
            for queue, entry in enqueued:
                for hook in self.broker.completion_hooks:
                    hook(queue, entry)
            done()
        completion = Completion(confirmed)
        touched = list(dict.fromkeys([q for queues, _, _, _ in txn.publishes for q in queues if not q.deleted]
                                     + [consumer.queue for consumer, _, _ in txn.outcomes]))
        for observer in self.observers:
            observer.committing(txn.number, touched)
        with self.broker.atomically():
            for queues, data, deadline, durable in txn.publishes:
                for queue in queues:
                    if not queue.deleted:
                        enqueued.append((queue, queue.enqueue(data, deadline, completion, durable=durable)))
            for consumer, delivery, outcome in txn.outcomes:
                consumer.on_outcome(delivery, outcome, False, False)
                if not consumer.link.closed:
                    consumer.link.settle(delivery, 0)
        for observer in self.observers:
            observer.committed(txn.number, touched)
        completion.release()

    def rollback(self, txn: Transaction) -> None:
        """Forget its publishes; the messages it would have settled are released, as the client's own
        transaction code does with them after a rollback."""
        self.active.pop(txn.id, None)
        for consumer, delivery, _ in txn.outcomes:
            consumer.on_outcome(delivery, RELEASED, False, False)
            if not consumer.link.closed:
                consumer.link.settle(delivery, 0)

    def discharge(self, txn: Transaction, fail: bool, answer: Callable[[str | None, str], None]) -> None:
        """Commit (roll back if `fail`) here or where its work is; `answer(None, "")` once done as asked,
        `answer(condition, description)` if a commit could not be."""
        doomed = None if fail else txn.doomed
        if not (fail or doomed) and txn.elsewhere is None:
            self.commit(txn, lambda: answer(None, ""))
            return
        self.rollback(txn)  # what it holds here: nothing but refused outcomes when its work is elsewhere

        def done(condition: str | None, description: str) -> None:
            if doomed:
                answer(TXN_ROLLBACK, f"transaction '{txn.id.decode('utf-8', 'replace')}' was rolled back: {doomed}")
            else:
                answer(condition, description)
        if txn.elsewhere is None:
            done(None, "")
        else:
            txn.elsewhere.discharge(bool(fail or doomed), done)

    def controller_gone(self, controller: Link) -> None:
        for txn in [t for t in self.active.values() if t.controller is controller]:
            log.info("transaction '%s' rolled back: its controller link went away", txn.id.decode("utf-8", "replace"))
            self.rollback(txn)
            if txn.elsewhere is not None:
                txn.elsewhere.discharge(True, lambda condition, description: None)


def _control(data: bytes) -> tuple[str, list[Any]]:
    """A coordinator message: ('declare', [global-id]) or ('discharge', [txn-id, fail])."""
    message = Message()
    try:
        message.decode(data)
    except Exception as e:  # proton raises its own errors for bad encodings
        raise ValueError(f"undecodable message ({e})") from None
    body = message.body
    descriptor = getattr(body, "descriptor", None)
    fields = list(getattr(body, "value", None) or [])
    if descriptor in _DECLARE:
        return "declare", fields
    if descriptor in _DISCHARGE and fields:
        return "discharge", fields
    raise ValueError(f"a coordinator takes declare and discharge, not {body!r:.80}")


class Coordinator(LinkHandler):
    """The broker's end of a client's transaction controller link (target: a coordinator)."""

    def __init__(self, transactions: Transactions, link: Link) -> None:
        self.transactions = transactions
        self.link = link

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        link = self.link
        try:
            kind, fields = _control(data)
        except ValueError as e:
            link.settle(delivery, REJECTED, DECODE, str(e))
            return
        if kind == "declare":
            if fields and fields[0] is not None:
                link.settle(delivery, REJECTED, NOT_IMPLEMENTED, "only local transactions are supported (no global-id)")
                return
            txn = self.transactions.declare(link)
            link.settle_with_state(delivery, DECLARED, [txn.id])
            return
        txn_id = bytes(fields[0]) if fields[0] is not None else b""
        fail = bool(fields[1]) if len(fields) > 1 else False
        try:
            txn = self.transactions.find(txn_id, link.conn)
        except BrokerError as e:
            link.settle(delivery, REJECTED, e.condition, e.description)
            return

        def answer(condition: str | None, description: str) -> None:
            if not link.closed:
                link.settle(delivery, REJECTED if condition else ACCEPTED, condition, description)
        self.transactions.discharge(txn, fail, answer)

    def on_detach(self) -> None:
        self.transactions.controller_gone(self.link)
