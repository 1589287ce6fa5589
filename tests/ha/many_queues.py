"""Clients for thousands of queues: declare them through `$management` with many requests in flight, and
fill them through the anonymous relay, counting each publish when the broker settles it `accepted`.

Both are proton reactor handlers run to completion with a deadline (no sleeps): `declare_queues` returns
how many were created, `fill_queues` how many publishes were accepted, and each raises with what it saw
when its deadline passes first.
"""
from __future__ import annotations

from typing import Any

from proton import Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container

from haqueue.admin import ADMIN_TOOL


def _auth(user: str | None, password: str | None) -> dict[str, Any]:
    if user is None:
        return {"sasl_enabled": False}
    return {"allowed_mechs": "PLAIN", "user": user, "password": password,
            "properties": {symbol(ADMIN_TOOL): True}}


class _Declarer(MessagingHandler):
    """CREATE queue requests, `window` in flight, answers read from a dynamic reply queue."""

    def __init__(self, url: str, names: list[str], args: dict[str, Any], window: int, timeout: float,
                 auth: dict[str, Any]) -> None:
        super().__init__(prefetch=window)
        self.url, self.names, self.args, self.window, self.timeout, self.auth = url, names, args, window, timeout, auth
        self.sent = self.answered = 0
        self.failures: list[str] = []
        self.error: str | None = None
        self.reply_to: str | None = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False, **self.auth)
        self.sender = event.container.create_sender(self.conn, "$management")
        event.container.create_receiver(self.conn, None, dynamic=True)
        self.timer = event.container.schedule(self.timeout, self)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            self.reply_to = event.receiver.remote_source.address
            self._send()

    def on_sendable(self, event: Any) -> None:
        self._send()

    def _send(self) -> None:
        if self.reply_to is None:
            return
        while self.sender.credit and self.sent < len(self.names) and self.sent - self.answered < self.window:
            name = self.names[self.sent]
            self.sender.send(Message(body=self.args, reply_to=self.reply_to, correlation_id=self.sent,
                                     properties={"operation": "CREATE", "type": "queue", "name": name}))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.answered += 1
        status = int((event.message.properties or {}).get("statusCode", 0))
        if status >= 300:
            self.failures.append(f"{self.names[int(event.message.correlation_id)]}: {status} "
                                 f"{event.message.properties.get('statusDescription')}")
        if self.answered == len(self.names):
            self.timer.cancel()
            self.conn.close()
        else:
            self._send()

    def on_timer_task(self, event: Any) -> None:
        self.error = f"timed out after {self.timeout} s ({self.answered}/{len(self.names)} answered)"
        self.conn.close()

    def on_transport_error(self, event: Any) -> None:
        if self.answered < len(self.names):
            self.error = f"transport error: {event.transport.condition}"


def declare_queues(address: str, names: list[str], args: dict[str, Any] | None = None, window: int = 500,
                   timeout: float = 60.0, user: str | None = None, password: str | None = None) -> None:
    """CREATE every queue of `names` on the broker at `address`, `window` requests in flight."""
    handler = _Declarer(f"amqp://{address}", names, args or {}, window, timeout, _auth(user, password))
    Container(handler).run()
    if handler.error or handler.failures:
        raise AssertionError(f"declaring {len(names)} queues at {address}: {handler.error or ''} "
                             f"{len(handler.failures)} refused: {handler.failures[:5]}")


class _Filler(MessagingHandler):
    """Sends (address, body) pairs through the anonymous relay, durable, as fast as credit allows."""

    def __init__(self, url: str, messages: list[tuple[str, Any]], timeout: float) -> None:
        super().__init__(auto_settle=True)
        self.url, self.messages, self.timeout = url, messages, timeout
        self.sent = self.accepted = 0
        self.refused: list[str] = []
        self.error: str | None = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, sasl_enabled=False, reconnect=False)
        event.container.create_sender(self.conn, None)
        self.timer = event.container.schedule(self.timeout, self)

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.sent < len(self.messages):
            address, body = self.messages[self.sent]
            sender.send(Message(address=address, body=body, durable=True))
            self.sent += 1

    def _settled(self, event: Any) -> None:
        if self.accepted + len(self.refused) == len(self.messages):
            self.timer.cancel()
            event.connection.close()

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self._settled(event)

    def on_rejected(self, event: Any) -> None:
        self.refused.append(str(event.delivery.remote.condition))
        self._settled(event)

    def on_released(self, event: Any) -> None:
        self.refused.append("released")
        self._settled(event)

    def on_timer_task(self, event: Any) -> None:
        self.error = f"timed out after {self.timeout} s ({self.accepted}/{len(self.messages)} accepted)"
        self.conn.close()

    def on_transport_error(self, event: Any) -> None:
        if self.accepted + len(self.refused) < len(self.messages):
            self.error = f"transport error: {event.transport.condition}"


def fill_queues(address: str, messages: list[tuple[str, Any]], timeout: float = 60.0) -> int:
    """Publish each (queue, body) through the anonymous relay; how many were accepted."""
    handler = _Filler(f"amqp://{address}", messages, timeout)
    Container(handler).run()
    if handler.error or handler.refused:
        raise AssertionError(f"filling at {address}: {handler.error or ''} {handler.accepted} accepted, "
                             f"{len(handler.refused)} refused: {handler.refused[:5]}")
    return handler.accepted
