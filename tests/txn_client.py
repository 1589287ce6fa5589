"""A transactional client written as proton's tx_send/tx_recv examples are: a Container, a
TransactionHandler, `declare_transaction`, `Transaction.send`/`accept`, `commit`/`abort`.

`run_transaction` drives one transaction to its end and says how it ended, as the client saw it."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from proton import Described, Message, Terminus, symbol
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import ApplicationEvent, Container, EventInjector


@dataclass
class TxnResult:
    declared: bool = False
    txn_id: bytes | None = None
    outcome: str = "none"  # committed | aborted | commit_failed | declare_failed | none
    condition: str | None = None
    description: str | None = None
    received: list[Any] = field(default_factory=list)
    # each transactional publish's outcome: body, state, condition, description
    transfers: list[tuple[Any, str, str | None, str | None]] = field(default_factory=list)


class _Bounded(MessagingHandler):
    """A client run that ends by itself: on its outcome, on a transport error, or after `timeout`."""

    def __init__(self, result: TxnResult, timeout: float, **options: Any) -> None:
        super().__init__(**options)
        self.result, self.timeout = result, timeout
        self.timer: Any = None

    def _start_timer(self, event: Any) -> None:
        self.timer = event.container.schedule(self.timeout, self)  # on_timer_task ends the run

    def _refused(self, event: Any) -> None:
        self.result.outcome = "commit_failed"
        condition = event.delivery.remote.condition
        if condition is not None:
            self.result.condition, self.result.description = condition.name, condition.description
        self._end(event)

    def _end(self, event: Any) -> None:
        self.timer.cancel()
        event.connection.close()

    def on_timer_task(self, event: Any) -> None:
        self.result.condition = self.result.condition or "timed out"
        event.container.stop()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self.result.condition = condition.name if condition else "transport error"
        self.timer.cancel()
        event.container.stop()


_STATES = {0x34: "transactional", 0x24: "accepted", 0x25: "rejected", 0x26: "released", 0x27: "modified"}


class _TxnClient(_Bounded, TransactionHandler):
    def __init__(self, url: str, address: str, send: list[Message], receive: int, commit: bool,
                 hold: threading.Event | None, declared: threading.Event | None, result: TxnResult,
                 timeout: float, receive_from: str | None = None, link_per_address: bool = False) -> None:
        """`link_per_address`: each message goes on a sender to its own `address` (not the anonymous relay)."""
        super().__init__(result, timeout, prefetch=0, auto_accept=False)
        self.link_per_address = link_per_address
        self.senders: dict[str, Any] = {}
        self.bodies: dict[Any, Any] = {}  # delivery -> body of what was sent
        self.injector: EventInjector | None = None  # OpenTransaction's way in from the test's thread
        self.receive_from = receive_from or address
        self.url, self.address, self.to_send, self.to_receive = url, address, send, receive
        self.commit, self.hold, self.declared_event = commit, hold, declared
        self.txn: Any = None
        self.sender: Any = None
        self.receiver: Any = None
        self.sent = 0
        self.settled = 0  # transactional sends the broker has settled (taken into the transaction)
        self.discharged = False

    def on_start(self, event: Any) -> None:
        self._start_timer(event)
        self.conn = event.container.connect(self.url, reconnect=False)
        if self.to_send and self.link_per_address:
            for m in self.to_send:
                if m.address not in self.senders:
                    self.senders[m.address] = event.container.create_sender(self.conn, m.address)
            self.sender = next(iter(self.senders.values()))
        elif self.to_send:
            self.sender = event.container.create_sender(self.conn, self.address)
        if self.to_receive:
            self.receiver = event.container.create_receiver(self.conn, self.receive_from)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn = event.transaction
        self.result.declared = True
        self.result.txn_id = bytes(self.txn.id)
        if self.declared_event is not None:
            self.declared_event.set()
        self._send()
        if self.to_receive:
            self.receiver.flow(self.to_receive)
        self._maybe_discharge()

    def _send(self) -> None:
        while self.sent < len(self.to_send):
            message = self.to_send[self.sent]
            sender = self.senders[message.address] if self.link_per_address else self.sender
            if not sender.credit:
                return
            self.bodies[self.txn.send(sender, message)] = message.body
            self.sent += 1

    def on_sendable(self, event: Any) -> None:
        if self.txn is not None:
            self._send()
            self._maybe_discharge()

    def on_settled(self, event: Any) -> None:
        delivery = event.delivery
        if delivery in self.bodies:
            self.settled += 1
            condition = delivery.remote.condition
            self.result.transfers.append((self.bodies.pop(delivery), _STATES.get(delivery.remote_state, "other"),
                                          condition.name if condition else None,
                                          condition.description if condition else None))

    def _end(self, event: Any) -> None:
        super()._end(event)
        if self.injector is not None:
            self.injector.close()  # else it keeps the container running

    def on_send_more(self, event: Any) -> None:  # OpenTransaction.send_more, from the test's thread
        self.to_send.extend(event.subject)
        self._send()

    def on_discharge_now(self, event: Any) -> None:  # OpenTransaction.finish, from the test's thread
        self.hold = None
        self._maybe_discharge()

    def on_message(self, event: Any) -> None:
        self.result.received.append(event.message.body)
        self.txn.accept(event.delivery)
        self._maybe_discharge()

    def _maybe_discharge(self) -> None:
        if self.sent < len(self.to_send) or len(self.result.received) < self.to_receive or self.discharged:
            return
        if self.hold is not None:  # the test decides when (or whether) it ends
            return
        self.discharged = True
        self.txn.commit() if self.commit else self.txn.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self.result.outcome = "committed"
        self._end(event)

    def on_transaction_aborted(self, event: Any) -> None:
        self.result.outcome = "aborted"
        self._end(event)

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._refused(event)

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.result.outcome = "declare_failed"
        self._end(event)


def run_transaction(url: str, address: str | None, send: list[Message] = (), receive: int = 0, commit: bool = True,
                    timeout: float = 20.0, receive_from: str | None = None,
                    link_per_address: bool = False) -> TxnResult:
    """Send `send` (to `address`; None: each to its own `address`, on the anonymous relay or, with
    `link_per_address`, on a link to it) and receive-and-accept `receive` messages (from `receive_from`, else
    `address`) in one transaction, then commit or abort."""
    result = TxnResult()
    Container(_TxnClient(url, address, list(send), receive, commit, None, None, result, timeout, receive_from,
                         link_per_address)).run()
    return result


class OpenTransaction:
    """A transaction left open on its own thread (its messages sent, not discharged): the test kills
    the broker under it, or ends it with `finish()`."""

    def __init__(self, url: str, address: str, send: list[Message], timeout: float = 20.0, receive: int = 0) -> None:
        self.result = TxnResult()
        self.declared = threading.Event()
        self.client = _TxnClient(url, address, list(send), receive, True, threading.Event(), self.declared,
                                 self.result, timeout)
        container = Container(self.client)
        self.injector = self.client.injector = EventInjector()
        container.selectable(self.injector)
        self.thread = threading.Thread(target=container.run, daemon=True)
        self.thread.start()
        if not self.declared.wait(timeout):
            raise AssertionError(f"transaction not declared within {timeout} s")

    def taken(self) -> bool:
        """Has the broker taken every message into the transaction, and the client received what it wants?"""
        return self.client.settled == len(self.client.to_send) and \
            len(self.result.received) == self.client.to_receive

    def send_more(self, messages: list[Message]) -> None:
        """Send these too, in the transaction, on the client's own thread."""
        self.injector.trigger(ApplicationEvent("send_more", subject=list(messages)))

    def finish(self, commit: bool = True) -> None:
        """Discharge it now (commit or abort) on the client's own thread."""
        self.client.commit = commit
        self.injector.trigger(ApplicationEvent("discharge_now"))

    def join(self, timeout: float) -> TxnResult:
        self.thread.join(timeout)
        return self.result


class _Controller(_Bounded):
    """A bare coordinator link: it sends one control message (a discharge, as a client that lost its
    broker and reconnected would still send) and reads the outcome."""

    def __init__(self, url: str, body: Any, result: TxnResult, timeout: float) -> None:
        super().__init__(result, timeout)
        self.url, self.body = url, body

    def on_start(self, event: Any) -> None:
        self._start_timer(event)
        conn = event.container.connect(self.url, reconnect=False)
        session = conn.session()
        session.open()
        sender = session.sender("txn-ctrl")
        sender.target.type = Terminus.COORDINATOR
        sender.target.capabilities.put_object(symbol("amqp:local-transactions"))
        sender.open()
        self.sender = sender
        self.sent = False

    def on_sendable(self, event: Any) -> None:
        if not self.sent:
            self.sent = True
            event.sender.send(Message(body=self.body))

    def on_accepted(self, event: Any) -> None:
        self.result.outcome = "accepted"
        self._end(event)

    def on_rejected(self, event: Any) -> None:
        self._refused(event)


def control(url: str, body: Any, timeout: float = 20.0) -> TxnResult:
    """Send one message to a coordinator: outcome `accepted`, or `commit_failed` with the condition."""
    result = TxnResult()
    Container(_Controller(url, body, result, timeout)).run()
    return result


def discharge(url: str, txn_id: bytes, fail: bool = False, timeout: float = 20.0) -> TxnResult:
    return control(url, Described(symbol("amqp:discharge:list"), [txn_id, fail]), timeout)
