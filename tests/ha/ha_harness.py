"""Helpers for the HA tests: a cluster of real broker processes, its admin calls, and clients.

`HaCluster`   N `BrokerProcess`es (tests/harness.py) on free loopback ports, each configured with
              the `ha:` section naming all of them, a shared public address and random `ha`
              credentials. Brokers are created up front (every config must list every broker)
              but started only when the test says so, so a backup can join mid-stream.
`admin`       management calls as the `ha` user: status, promote, queue list, create/delete.
Clients       proton BlockingConnections: anonymous without SASL for clients (public address),
              SASL PLAIN as `ha` for looking at a backup (admin, browsing its queues).
`Load`        a producer and a consumer thread through the public address that reconnect across
              a failover and count what was confirmed, received and received twice.

Every wait is a poll of a condition with a deadline (`wait_for`).
"""
from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from proton import Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy
from proton.utils import BlockingConnection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import BrokerProcess, can_connect, free_port, run_haqueue, split_address, wait_for  # noqa: E402

from haqueue.admin import AdminClient, AdminError  # noqa: E402

HA_USER = "ha"
CLIENT_TIMEOUT = 10.0


class Refused(AssertionError):
    """A management request answered with statusCode >= 400."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{code}: {description}")
        self.code = code
        self.description = description


# ---------------------------------------------------------------------------------------------
# The cluster

class HaCluster:
    def __init__(self, directory: Path, size: int = 3, backup_timeout: float = 2.0,
                 replicate: str | None = None, extra: dict[str, Any] | None = None,
                 ha_extra: dict[str, Any] | None = None) -> None:
        self.directory = Path(directory)
        self.password = secrets.token_hex(8)
        self.public = f"127.0.0.1:{free_port()}"
        self.brokers: list[BrokerProcess] = []
        for i in range(size):
            name = f"b{i}"
            self.brokers.append(BrokerProcess(self.directory / name, {"name": name, "listen": ["127.0.0.1:0"],
                                                                       **(extra or {})}, name=name))
        ha: dict[str, Any] = {"brokers": [b.address for b in self.brokers], "public": self.public,
                              "username": HA_USER, "password": self.password, "backup_timeout": backup_timeout}
        if replicate is not None:
            ha["replicate"] = replicate
        ha.update(ha_extra or {})
        for b in self.brokers:
            b.config["ha"] = dict(ha)
        self.stopped: set[str] = set()  # names of SIGSTOPped brokers (SIGCONT at teardown)

    def __getitem__(self, i: int) -> BrokerProcess:
        return self.brokers[i]

    def __iter__(self):
        return iter(self.brokers)

    # -- processes ------------------------------------------------------------------------------
    def start(self, *indices: int) -> None:
        for i in indices or range(len(self.brokers)):
            if not self.brokers[i].running:
                self.brokers[i].start()

    def sigstop(self, b: BrokerProcess) -> None:
        os.kill(b.pid, signal.SIGSTOP)
        self.stopped.add(b.name)

    def sigcont(self, b: BrokerProcess) -> None:
        os.kill(b.pid, signal.SIGCONT)
        self.stopped.discard(b.name)

    def kill(self, b: BrokerProcess) -> None:
        self.stopped.discard(b.name)
        b.kill()

    def shutdown(self) -> None:
        for b in self.brokers:
            if b.running and b.name in self.stopped:
                os.kill(b.pid, signal.SIGCONT)
        self.stopped.clear()
        for b in self.brokers:
            if b.running:
                b.signal(signal.SIGTERM)
        for b in self.brokers:
            b.stop(timeout=5)

    # -- admin ----------------------------------------------------------------------------------
    def admin(self, b: BrokerProcess | str, timeout: float = 5.0) -> AdminClient:
        address = b if isinstance(b, str) else b.address
        return AdminClient(address, timeout, HA_USER, self.password)

    def request(self, b: BrokerProcess | str, operation: str, type_: str, name: str | None = None,
                body: dict | None = None, timeout: float = 5.0) -> Any:
        with self.admin(b, timeout) as client:
            code, description, answer = client.request(operation, type_, name, body)
        if code >= 400:
            raise Refused(code, description)
        return answer

    def status(self, b: BrokerProcess, timeout: float = 5.0) -> dict[str, Any]:
        return self.request(b, "READ", "ha", timeout=timeout)

    def try_status(self, b: BrokerProcess) -> dict[str, Any] | None:
        try:
            return self.status(b, timeout=2.0)
        except (AdminError, Refused):
            return None

    def promote(self, b: BrokerProcess, force: bool = False) -> dict[str, Any]:
        answer = self.request(b, "PROMOTE", "ha", body={"force": force})
        wait_for(lambda: can_connect(*split_address(self.public)), 10, message=f"public address {self.public}")
        return answer

    def cli(self, b: BrokerProcess | str, *args: str, timeout: float = 30.0):
        address = b if isinstance(b, str) else b.address
        return run_haqueue(["admin", "-b", address, "--user", HA_USER, "--password", self.password, *args],
                           timeout=timeout)

    def queues(self, b: BrokerProcess) -> dict[str, dict[str, Any]]:
        return {q["name"]: q for q in self.request(b, "QUERY", "queue") or []}

    def exchanges(self, b: BrokerProcess) -> dict[str, dict[str, Any]]:
        return {x["name"]: x for x in self.request(b, "QUERY", "exchange") or []}

    def bindings(self, b: BrokerProcess) -> list[dict[str, Any]]:
        return list(self.request(b, "QUERY", "binding") or [])

    def depth(self, b: BrokerProcess, queue: str) -> int | None:
        q = self.queues(b).get(queue)
        return None if q is None else q["depth"]

    # -- waiting on roles and states --------------------------------------------------------------
    def wait_state(self, b: BrokerProcess, role: str, state: str | None = None, timeout: float = 15.0,
                   check: Callable[[dict], bool] | None = None) -> dict[str, Any]:
        def ok():
            s = self.try_status(b)
            return s if s and s["role"] == role and (state is None or s["state"] == state) and \
                (check is None or check(s)) else None
        return wait_for(ok, timeout, message=f"{b.name} {role} {state or ''} (last: {self.try_status(b)})")

    def wait_ready(self, b: BrokerProcess, timeout: float = 15.0, queues: Iterable[str] = ()) -> dict[str, Any]:
        """A backup in state ready, following a primary, with each named queue caught up."""
        names = list(queues)
        return self.wait_state(b, "backup", "ready", timeout, check=lambda s: s.get("primary") and all(
            s["queues"].get(n, {}).get("caught_up") for n in names))

    def wait_backups_ready(self, primary: BrokerProcess, names: Iterable[str], timeout: float = 15.0) -> dict:
        wanted = set(names)
        return self.wait_state(primary, "primary", None, timeout, check=lambda s: wanted <= {
            x["name"] for x in s["backups"] if x["state"] == "ready"})

    def wait_depth(self, b: BrokerProcess, queue: str, depth: int, timeout: float = 15.0) -> None:
        last: list[Any] = [None]

        def ok():
            try:
                last[0] = self.depth(b, queue)
            except (AdminError, Refused) as e:
                last[0] = e
                return False
            return last[0] == depth
        try:
            wait_for(ok, timeout, message=f"depth {depth} of {queue} on {b.name}")
        except AssertionError as e:
            raise AssertionError(f"{e} (last seen: {last[0]})") from None

    def start_cluster(self, primary: int = 0, timeout: float = 20.0) -> BrokerProcess:
        """Start every broker, promote one, wait until every other is a ready backup it knows."""
        self.start()
        p = self.brokers[primary]
        self.promote(p)
        others = [b for b in self.brokers if b is not p]
        for b in others:
            self.wait_ready(b, timeout)
        self.wait_backups_ready(p, [b.name for b in others], timeout)
        self.wait_state(p, "primary", "active", timeout)
        return p

    # -- content on any broker (as the ha user on a backup) ----------------------------------------
    def browse(self, b: BrokerProcess, queue: str, n: int | None = None, timeout: float = 10.0) -> list[Message]:
        """The messages on `queue` in order, without acquiring them (a browser as the ha user)."""
        if n is None:
            n = self.depth(b, queue) or 0
        if n > 200:
            return fast_browse(b.address, queue, n, max(timeout, 30.0), user=HA_USER, password=self.password)
        return browse(b.address, queue, n, timeout, user=HA_USER, password=self.password)

    def bodies(self, b: BrokerProcess, queue: str, n: int | None = None) -> list[Any]:
        return [m.body for m in self.browse(b, queue, n)]

    def log_tails(self, lines: int = 60) -> str:
        out = []
        for b in self.brokers:
            tail = "\n".join(b.log().splitlines()[-lines:])
            out.append(f"==== {b.name} {b.address} ({b.log_path}) ====\n{tail}")
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Clients

def connect(address: str, timeout: float = CLIENT_TIMEOUT, user: str | None = None,
            password: str | None = None) -> BlockingConnection:
    auth: dict[str, Any] = ({"sasl_enabled": False} if user is None else
                            {"allowed_mechs": "PLAIN", "user": user, "password": password})
    return BlockingConnection(f"amqp://{address}", timeout=timeout, reconnect=False, **auth)


def browse(address: str, queue: str, n: int, timeout: float = 10.0, **auth: Any) -> list[Message]:
    conn = connect(address, timeout, **auth)
    try:
        r = conn.create_receiver(queue, credit=max(n, 1), options=Copy())
        got = []
        for _ in range(n):
            got.append(r.receive(timeout=timeout))
            if r.fetcher.unsettled:  # browsed messages normally arrive settled
                r.accept()
        return got
    finally:
        conn.close()


class _BulkSender(MessagingHandler):
    """Sends messages as fast as credit allows; counts outcomes; stops when all are settled."""

    def __init__(self, url: str, address: str, messages: list[Message], timeout: float) -> None:
        super().__init__(auto_settle=True)
        self.url, self.address, self.messages, self.timeout = url, address, messages, timeout
        self.sent = self.accepted = self.refused = 0
        self.error: str | None = None
        self.done = False

    def on_start(self, event):
        self.conn = event.container.connect(self.url, sasl_enabled=False, reconnect=False)
        event.container.create_sender(self.conn, self.address)
        self.timer = event.container.schedule(self.timeout, self)

    def on_timer_task(self, event):
        if not self.done:
            self.error = f"timed out after {self.timeout} s ({self.accepted}/{len(self.messages)} accepted)"
            self.conn.close()

    def on_sendable(self, event):
        sender = event.sender
        while sender.credit and self.sent < len(self.messages):
            sender.send(self.messages[self.sent])
            self.sent += 1

    def _settled(self, event):
        if self.accepted + self.refused == len(self.messages):
            self.done = True
            self.timer.cancel()
            event.connection.close()

    def on_accepted(self, event):
        self.accepted += 1
        self._settled(event)

    def on_rejected(self, event):
        self.refused += 1
        self._settled(event)

    def on_released(self, event):
        self.refused += 1
        self._settled(event)

    def on_transport_error(self, event):
        if not self.done:
            self.error = f"transport error: {event.transport.condition}"

    def on_connection_error(self, event):
        if not self.done:
            self.error = f"connection error: {event.connection.remote_condition}"


class _Browser(MessagingHandler):
    """Reads n messages from a queue as a browser (copy), as fast as the broker sends them."""

    def __init__(self, url: str, queue: str, n: int, timeout: float, auth: dict[str, Any]) -> None:
        super().__init__(prefetch=1000, auto_accept=False)
        self.url, self.queue, self.n, self.timeout, self.auth = url, queue, n, timeout, auth
        self.messages: list[Message] = []
        self.error: str | None = None

    def on_start(self, event):
        self.conn = event.container.connect(self.url, reconnect=False, **self.auth)
        event.container.create_receiver(self.conn, self.queue, options=Copy())
        self.timer = event.container.schedule(self.timeout, self)
        if self.n == 0:
            self._finish()

    def _finish(self):
        self.timer.cancel()
        self.conn.close()

    def on_timer_task(self, event):
        self.error = f"timed out after {self.timeout} s with {len(self.messages)}/{self.n} messages"
        self.conn.close()

    def on_message(self, event):
        if len(self.messages) < self.n:
            self.messages.append(event.message)
            if len(self.messages) == self.n:
                self._finish()

    def on_transport_error(self, event):
        if len(self.messages) < self.n:
            self.error = f"transport error: {event.transport.condition}"


def fast_browse(address: str, queue: str, n: int, timeout: float = 30.0, user: str | None = None,
                password: str | None = None) -> list[Message]:
    auth: dict[str, Any] = ({"sasl_enabled": False} if user is None else
                            {"allowed_mechs": "PLAIN", "user": user, "password": password})
    handler = _Browser(f"amqp://{address}", queue, n, timeout, auth)
    Container(handler).run()
    if handler.error:
        raise AssertionError(f"browse {queue} at {address}: {handler.error}")
    return handler.messages


def send_all(address: str, queue: str, messages: Iterable[Message | Any], timeout: float = 30.0) -> None:
    """Send every message and wait (bounded) until each is accepted; raise otherwise."""
    msgs = [m if isinstance(m, Message) else Message(body=m, durable=True) for m in messages]
    handler = _BulkSender(f"amqp://{address}", queue, msgs, timeout)
    Container(handler).run()
    if handler.error or handler.accepted != len(msgs):
        raise AssertionError(f"send to {queue} at {address}: {handler.accepted}/{len(msgs)} accepted, "
                             f"{handler.refused} refused, error {handler.error}")


def receive(address: str, queue: str, n: int, timeout: float = 10.0, accept: bool = True) -> list[Message]:
    """Receive (and accept) exactly n messages from queue."""
    conn = connect(address, timeout)
    try:
        r = conn.create_receiver(queue, credit=min(max(n, 1), 500))
        got = []
        for _ in range(n):
            got.append(r.receive(timeout=timeout))
            if accept:
                r.accept()
        return got
    finally:
        conn.close()


def expect_refused_client(address: str, timeout: float = 5.0) -> str:
    """Connect anonymously and expect the broker to close the connection; returns the reason."""
    try:
        conn = connect(address, timeout)
    except Exception as e:  # noqa: BLE001 - proton raises ConnectionException and friends
        return str(e)
    try:
        conn.create_sender("anything")
    except Exception as e:  # noqa: BLE001
        return str(e)
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
    raise AssertionError(f"{address} admitted an anonymous client")


# ---------------------------------------------------------------------------------------------
# Continuous load across a failover

class Load:
    """A producer and a consumer on `queue` through `address`, each reconnecting on any error.

    The producer sends body i (ints from 0) and waits for each settlement: `confirmed` holds the
    bodies the broker accepted. A send that failed is retried with the same body (so the broker
    may hold it twice). The consumer accepts each message and records its body in `received`.
    """

    def __init__(self, address: str, queue: str, first: int = 0) -> None:
        self.address, self.queue = address, queue
        self.confirmed: set[int] = set()
        self.received: list[int] = []
        self.errors: list[str] = []
        self.next = first
        self._stop = threading.Event()
        self._stop_consumer = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def _connect(self, stop: threading.Event) -> BlockingConnection | None:
        while not stop.is_set():
            try:
                return connect(self.address, timeout=5.0)
            except Exception as e:  # noqa: BLE001
                self._error(f"connect: {e}")
                stop.wait(0.1)  # retry pace while the public address moves
        return None

    def _error(self, text: str) -> None:
        with self._lock:
            if len(self.errors) < 200:
                self.errors.append(text)

    def _produce(self) -> None:
        conn = sender = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = self._connect(self._stop)
                    if conn is None:
                        break
                    sender = conn.create_sender(self.queue)
                sender.send(Message(body=self.next, durable=True), timeout=5.0)
                with self._lock:
                    self.confirmed.add(self.next)
                self.next += 1
            except Exception as e:  # noqa: BLE001 - lost connection, timeout, refusal: retry this body
                self._error(f"send {self.next}: {type(e).__name__}: {e}")
                conn = self._close(conn)
        self._close(conn)

    def _consume(self) -> None:
        conn = receiver = None
        while not self._stop_consumer.is_set():
            try:
                if conn is None:
                    conn = self._connect(self._stop_consumer)
                    if conn is None:
                        break
                    receiver = conn.create_receiver(self.queue, credit=20)
                try:
                    m = receiver.receive(timeout=0.5)
                except Timeout:
                    continue
                receiver.accept()
                with self._lock:
                    self.received.append(m.body)
            except Exception as e:  # noqa: BLE001
                self._error(f"receive: {type(e).__name__}: {e}")
                conn = self._close(conn)
        self._close(conn)

    @staticmethod
    def _close(conn: BlockingConnection | None) -> None:
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        return None

    def confirmed_count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def received_count(self) -> int:
        with self._lock:
            return len(self.received)

    def stop_producer(self, timeout: float = 15.0) -> None:
        self._stop.set()
        self.threads[0].join(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        self._stop_consumer.set()
        for t in self.threads:
            t.join(timeout)

    def report(self) -> dict[str, Any]:
        counts = Counter(self.received)
        lost = sorted(self.confirmed - set(counts))
        return {"confirmed": len(self.confirmed), "received": len(self.received),
                "distinct": len(counts), "lost": lost,
                "duplicates": sorted(b for b, c in counts.items() if c > 1),
                "errors": len(self.errors), "first_errors": self.errors[:5]}
