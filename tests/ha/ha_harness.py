"""Helpers for the HA tests: a cluster of real broker processes, its admin calls, and clients.

`HaCluster`   N `BrokerProcess`es (tests/harness.py) on free loopback ports, each configured with
              the `ha:` section naming all of them, a shared public address (unless `public=False`)
              and random `ha` credentials. Brokers are created up front (every config must list
              every broker) but started only when the test says so, so a backup can join mid-stream.
              The ZooKeeper tests' `ZkCluster` is one too.
`admin`       management calls: status and promote as the `ha` peer user (what the supervisor and the
              OCF agent use), queues, exchanges and bindings as `ops`, an admin user allowed everything
              (the peer user may not manage queues: design/permissions.md).
`cluster_factory`  the body of a pytest fixture making clusters that are always stopped after the test.
Clients       proton BlockingConnections: anonymous without SASL for clients (public address),
              SASL PLAIN as `ops`, marked as an admin tool, for looking at a backup (browsing its queues).
`Load`        a producer and a consumer thread through the public address that reconnect across
              a failover and count what was confirmed, received and received twice; the Pacemaker
              tests' `Load` (through a VIP) is one too, connecting differently.

Every wait is a poll of a condition with a deadline (`wait_for`).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import pytest
from proton import Endpoint, Message, Timeout, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, Copy
from proton.utils import BlockingConnection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import (POLL_INTERVAL, BrokerProcess, can_connect, free_port, process_state, run_haqueue,  # noqa: E402
                     split_address, unexpected_exits, wait_for)

from haqueue.admin import ADMIN_TOOL, AdminClient, AdminError  # noqa: E402
from haqueue.config import TlsConfig  # noqa: E402
from haqueue.audit.ledger import Ledger  # noqa: E402

T = TypeVar("T")

HA_USER = "ha"
OPS_USER = "ops"  # an admin tool's user, allowed everything; same password as the peer user
CLIENT_TIMEOUT = 10.0


class Refused(AssertionError):
    """A management request answered with statusCode >= 400."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{code}: {description}")
        self.code = code
        self.description = description


# ---------------------------------------------------------------------------------------------
# The cluster

# A primary and one backup that go on confirming after either fails: the opt-out of the floor
# (design/replication.md). Without it a pair stops confirming while one of the two is down.
PAIR_GOES_ON = {"min_confirmations": 1}

class HaCluster:
    state_timeout = 15.0  # default bound of `wait_state`, and its poll interval
    state_interval = POLL_INTERVAL

    def __init__(self, directory: Path, size: int = 3, backup_timeout: float = 2.0,
                 replicate: str | None = None, extra: dict[str, Any] | None = None,
                 ha_extra: dict[str, Any] | None = None, public: bool = True) -> None:
        self.directory = Path(directory)
        self.password = secrets.token_hex(8)
        self.public = f"127.0.0.1:{free_port()}" if public else None
        self.brokers: list[BrokerProcess] = []
        ops = {"password": self.password, "allow": {"send": ["*"], "receive": ["*"], "manage": ["*"], "admin": True}}
        for i in range(size):
            name = f"b{i}"
            config = {"name": name, "listen": ["127.0.0.1:0"], **(extra or {})}
            config["users"] = {OPS_USER: ops, **config.get("users", {})}
            self.brokers.append(BrokerProcess(self.directory / name, config, name=name))
        ha: dict[str, Any] = {"brokers": [b.address for b in self.brokers], "public": self.public,
                              "username": HA_USER, "password": self.password, "backup_timeout": backup_timeout}
        if not public:
            del ha["public"]
        if replicate is not None:
            ha["replicate"] = replicate
        ha.update(ha_extra or {})
        self.tls = TlsConfig(**ha["tls"]) if "tls" in ha else None  # ha.tls: admin calls need a peer certificate
        for b in self.brokers:
            b.config["ha"] = dict(ha)
        self.stopped: set[str] = set()  # names of SIGSTOPped brokers (SIGCONT at teardown)

    def __getitem__(self, i: int) -> BrokerProcess:
        return self.brokers[i]

    def __iter__(self):
        return iter(self.brokers)

    # -- processes ------------------------------------------------------------------------------
    def start(self, *indices: int) -> None:
        """Start the brokers (all, or those at `indices`) that are not running, all at once: each then waits for
        the others' listeners as it would for brokers on other machines (started one after another, a cluster
        took a Python start-up per broker before its first promotion)."""
        starting = [b for b in (self.brokers[i] for i in indices or range(len(self.brokers))) if not b.running]
        for b in starting:
            b.start(wait=False)
        for b in starting:
            b.wait_listening()

    def sigstop(self, b: BrokerProcess) -> None:
        os.kill(b.pid, signal.SIGSTOP)
        self.stopped.add(b.name)

    @staticmethod
    def halted(b: BrokerProcess) -> bool:
        """Whether b's process is stopped by a signal now: by sigstop, or by its own (test_hooks.py)."""
        return process_state(b.pid) == "T"

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
    def admin(self, b: BrokerProcess | str, timeout: float = 5.0, user: str = OPS_USER) -> AdminClient:
        address = b if isinstance(b, str) else b.address
        return AdminClient(address, timeout, user, self.password, self.tls)

    def request(self, b: BrokerProcess | str, operation: str, type_: str, name: str | None = None,
                body: dict | None = None, timeout: float = 5.0, user: str = OPS_USER) -> Any:
        with self.admin(b, timeout, user) as client:
            code, description, answer = client.request(operation, type_, name, body)
        if code >= 400:
            raise Refused(code, description)
        return answer

    def status(self, b: BrokerProcess, timeout: float = 5.0) -> dict[str, Any]:
        return self.request(b, "READ", "ha", timeout=timeout, user=HA_USER)

    def try_status(self, b: BrokerProcess, timeout: float = 2.0) -> dict[str, Any] | None:
        """The broker's `ha` status, or None if it does not answer."""
        try:
            return self.request(b, "READ", "ha", timeout=timeout, user=HA_USER)
        except (AdminError, Refused):
            return None

    def best_backup(self, exclude: Iterable[BrokerProcess] = ()) -> BrokerProcess | None:
        """The running ready backup that has applied the most (what the supervisor would promote)."""
        best, best_applied = None, -1
        for b in self.brokers:
            if b in exclude or not b.running:
                continue
            s = self.try_status(b)
            if s and s["role"] == "backup" and s["state"] == "ready" and s["applied"] > best_applied:
                best, best_applied = b, s["applied"]
        return best

    def promote(self, b: BrokerProcess, force: bool = False) -> dict[str, Any]:
        answer = self.request(b, "PROMOTE", "ha", body={"force": force}, user=HA_USER)
        if self.public is not None:
            wait_for(lambda: can_connect(*split_address(self.public)), 10, message=f"public address {self.public}")
        return answer

    def cli(self, b: BrokerProcess | str, *args: str, timeout: float = 30.0, user: str = OPS_USER):
        address = b if isinstance(b, str) else b.address
        tls = [] if self.tls is None else ["--tls-ca", str(self.tls.ca_file), "--tls-cert", self.tls.cert_file,
                                           "--tls-key", self.tls.key_file]
        return run_haqueue(["admin", "-b", address, "--user", user, "--password", self.password, *tls, *args],
                           timeout=timeout)

    def queues(self, b: BrokerProcess) -> dict[str, dict[str, Any]]:
        with self.admin(b) as client:  # every page of them
            return {q["name"]: q for q in client.query("queue")}

    def exchanges(self, b: BrokerProcess) -> dict[str, dict[str, Any]]:
        with self.admin(b) as client:
            return {x["name"]: x for x in client.query("exchange")}

    def bindings(self, b: BrokerProcess) -> list[dict[str, Any]]:
        with self.admin(b) as client:
            return list(client.query("binding"))

    def depth(self, b: BrokerProcess, queue: str) -> int | None:
        q = self.queues(b).get(queue)
        return None if q is None else q["depth"]

    # -- waiting on roles and states --------------------------------------------------------------
    def wait_state(self, b: BrokerProcess, role: str, state: str | None = None, timeout: float | None = None,
                   check: Callable[[dict], bool] | None = None) -> dict[str, Any]:
        def ok():
            s = self.try_status(b)
            return s if s and s["role"] == role and (state is None or s["state"] == state) and \
                (check is None or check(s)) else None
        return wait_for(ok, self.state_timeout if timeout is None else timeout, interval=self.state_interval,
                        message=f"{b.name} {role} {state or ''} (last: {self.try_status(b)})")

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

    # -- content on any broker (as an admin tool on a backup) --------------------------------------
    def browse(self, b: BrokerProcess, queue: str, n: int | None = None, timeout: float = 10.0) -> list[Message]:
        """The messages on `queue` in order, without acquiring them (a browser as the ops admin tool)."""
        if n is None:
            n = self.depth(b, queue) or 0
        if n > 200:
            return fast_browse(b.address, queue, n, max(timeout, 30.0), user=OPS_USER, password=self.password)
        return browse(b.address, queue, n, timeout, user=OPS_USER, password=self.password)

    def bodies(self, b: BrokerProcess, queue: str, n: int | None = None) -> list[Any]:
        return [m.body for m in self.browse(b, queue, n)]

    def log_tails(self, lines: int = 60) -> str:
        out = []
        for b in self.brokers:
            tail = "\n".join(b.log().splitlines()[-lines:])
            out.append(f"==== {b.name} {b.address} ({b.log_path}) ====\n{tail}")
        return "\n".join(out)


def with_metrics(c: HaCluster) -> dict[str, str]:
    """Give every broker of a cluster not started yet a metrics endpoint on a free port; its address by
    broker name."""
    addresses = {}
    for b in c:
        address = f"127.0.0.1:{free_port()}"
        b.config["metrics"] = {"listen": address}
        addresses[b.name] = address
    return addresses


Cluster = TypeVar("Cluster", bound=HaCluster)


def cluster_factory(new_cluster: Callable[..., Cluster], directory: Path, log_lines: int = 80,
                    fail_on_crash: bool = True) -> Iterator[Callable[..., Cluster]]:
    """The body of a fixture (``yield from cluster_factory(HaCluster, tmp_path)``) that yields
    ``make(size=3, **kw)``: a new cluster ``new_cluster(directory / "clusterN", size=size, **kw)``, not
    started. After the test every cluster made is shut down (SIGCONT, stop) and the last `log_lines`
    of each broker's log printed (pytest shows them when the test fails); with `fail_on_crash`, a
    broker that exited without the test asking fails the test."""
    made: list[Cluster] = []

    def make(size: int = 3, **kw: Any) -> Cluster:
        cluster = new_cluster(directory / f"cluster{len(made)}", size=size, **kw)
        made.append(cluster)
        return cluster

    yield make
    crashed = []
    for cluster in made:
        crashed += unexpected_exits(cluster.brokers)
        cluster.shutdown()
        print(cluster.log_tails(log_lines))
    if crashed and fail_on_crash:
        pytest.fail("; ".join(crashed), pytrace=False)


# ---------------------------------------------------------------------------------------------
# Clients

def _auth(user: str | None, password: str | None) -> dict[str, Any]:
    """Anonymous without SASL; or SASL PLAIN marked as an admin tool, which a backup lets in (design/permissions.md)."""
    return ({"sasl_enabled": False} if user is None else
            {"allowed_mechs": "PLAIN", "user": user, "password": password, "properties": {symbol(ADMIN_TOOL): True}})


class Connection(BlockingConnection):
    """A BlockingConnection whose close gives up on a peer that stopped answering (SIGSTOPped, or behind a
    public address that moved): proton's waits its timeout for the peer's close, then runs its reactor
    until the socket breaks, tens of seconds later, while the client should be reconnecting."""

    def close(self) -> None:
        if self.conn is not None and not self.closing:
            self.conn.close()
            try:
                self.wait(lambda: not (self.conn.state & Endpoint.REMOTE_ACTIVE), msg="Closing connection")
            except Exception:  # noqa: BLE001 - timed out or broken: drop the socket, no close frame awaited
                if self.conn.transport is not None:
                    self.conn.transport.close_tail()
                    self.conn.transport.close_head()
        super().close()


def connect(address: str, timeout: float = CLIENT_TIMEOUT, user: str | None = None,
            password: str | None = None, container_id: str | None = None) -> BlockingConnection:
    """`container_id`: the client's own (a durable subscription is named from it), else a random one."""
    container = Container(container_id=container_id) if container_id else None
    return Connection(f"amqp://{address}", timeout=timeout, reconnect=False, container=container,
                              **_auth(user, password))


def browse(address: str, queue: str, n: int, timeout: float = 10.0, **auth: Any) -> list[Message]:
    conn = connect(address, timeout, **auth)
    try:
        r = conn.create_receiver(queue, credit=max(n, 1), options=Copy())
        got = []
        for _ in range(n):
            got.append(r.receive(timeout=timeout))
            if r.fetcher.unsettled:  # browsed messages arrive unsettled unless the link asked otherwise
                r.accept()
        return got
    finally:
        conn.close()


class _BulkSender(MessagingHandler):
    """Sends messages as fast as credit allows; counts outcomes; stops when all are settled."""

    def __init__(self, url: str, address: str, messages: list[Message], timeout: float,
                 auth: dict[str, Any] | None = None) -> None:
        super().__init__(auto_settle=True)
        self.url, self.address, self.messages, self.timeout = url, address, messages, timeout
        self.auth = auth or _auth(None, None)
        self.sent = self.accepted = self.refused = 0
        self.error: str | None = None
        self.done = False

    def on_start(self, event):
        self.conn = event.container.connect(self.url, reconnect=False, **self.auth)
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
    handler = _Browser(f"amqp://{address}", queue, n, timeout, _auth(user, password))
    Container(handler).run()
    if handler.error:
        raise AssertionError(f"browse {queue} at {address}: {handler.error}")
    return handler.messages


def send_all(address: str, queue: str, messages: Iterable[Message | Any], timeout: float = 30.0,
             user: str | None = None, password: str | None = None) -> None:
    """Send every message and wait (bounded) until each is accepted; raise otherwise."""
    msgs = [m if isinstance(m, Message) else Message(body=m, durable=True) for m in messages]
    handler = _BulkSender(f"amqp://{address}", queue, msgs, timeout, _auth(user, password))
    Container(handler).run()
    if handler.error or handler.accepted != len(msgs):
        raise AssertionError(f"send to {queue} at {address}: {handler.accepted}/{len(msgs)} accepted, "
                             f"{handler.refused} refused, error {handler.error}")


def send_unconfirmed(address: str, queue: str, messages: Iterable[Message | Any], wait: float = 1.0) -> int:
    """Send every message and keep the connection `wait` seconds without needing their confirmation (a primary
    alone withholds it: the floor); returns how many were accepted meanwhile."""
    msgs = [m if isinstance(m, Message) else Message(body=m, durable=True) for m in messages]
    handler = _BulkSender(f"amqp://{address}", queue, msgs, wait)
    Container(handler).run()
    return handler.accepted


def receive(address: str, queue: str, n: int, timeout: float = 10.0, accept: bool = True,
            user: str | None = None, password: str | None = None) -> list[Message]:
    """Receive (and accept) exactly n messages from queue."""
    conn = connect(address, timeout, user, password)
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

    The producer sends body i (ints from `first`) and waits for each settlement: `confirmed` maps
    each body the broker accepted to when (monotonic). A send that failed is retried with the same
    body (so the broker may hold it twice); `error_times` holds when each producer failure was seen.
    The consumer accepts each message and records its body in `received`. With `ledger` (a path),
    message i has message-id `<queue>-<i>` and both write a client ledger there for
    `haqueue audit lag --ledger` (haqueue/audit/ledger.py): clients `producer` and `consumer`.

    How a connection is made is `_connect`: here, retried (every 0.1 s, each failure logged as a
    `connect:` error) until it succeeds or the thread is stopped, as the public address moves. A
    subclass may instead try once and let a failure count as a failed send or receive, which
    is followed by `retry_pause` seconds before the next try.
    """

    connect_timeout = 5.0
    consumer_container: str | None = None  # the consumer's container-id (a durable subscriber's), else random
    send_timeout = 5.0
    retry_pause = 0.0
    credit = 20  # the consumer's: deliveries in flight to it
    max_errors = 500

    def __init__(self, address: str, queue: str, first: int = 0, ledger: Path | None = None) -> None:
        self.address, self.queue = address, queue
        self.ledgers = (Ledger(ledger, "producer"), Ledger(ledger, "consumer")) if ledger is not None else None
        self.confirmed: dict[int, float] = {}
        self.received: list[int] = []
        self.errors: list[str] = []
        self.error_times: list[float] = []
        self.next = first
        self._stop_producer = threading.Event()
        self._stop_consumer = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._produce, daemon=True, name="producer"),
                        threading.Thread(target=self._consume, daemon=True, name="consumer")]

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def _connect(self, stop: threading.Event) -> BlockingConnection | None:
        """A connection to `address` (each try to `_address()`), or None once `stop` is set."""
        while not stop.is_set():
            try:
                container = self.consumer_container if stop is self._stop_consumer else None
                return connect(self._address(), timeout=self.connect_timeout, container_id=container)
            except Exception as e:  # noqa: BLE001
                self._error(f"connect: {e}")
                stop.wait(0.1)  # retry pace while the public address moves
        return None

    def _address(self) -> str:
        """Where the next try connects: `address`; a cluster without one (ZooKeeper's) tries each broker in turn."""
        return self.address

    def _error(self, text: str) -> None:
        with self._lock:
            if len(self.errors) < self.max_errors:
                self.errors.append(f"{time.monotonic():.3f} {text}")

    def _keep_going(self, stop: threading.Event, open_link: Callable[[BlockingConnection], Any],
                    step: Callable[[Any], None], failed: Callable[[Exception], None]) -> None:
        """`step(link)` until `stop` is set; after any error (`failed(error)`), a new connection and link."""
        conn = link = None
        while not stop.is_set():
            try:
                if conn is None:
                    conn = self._connect(stop)
                    if conn is None:
                        break
                    link = open_link(conn)
                step(link)
            except Exception as e:  # noqa: BLE001 - lost connection, timeout, refusal: retry
                failed(e)
                conn = _close(conn)
                stop.wait(self.retry_pause)
        _close(conn)

    def _produce(self) -> None:
        self._keep_going(self._stop_producer, lambda conn: conn.create_sender(self.queue), self._send_next,
                         self._send_failed)

    def _send_next(self, sender: Any) -> None:
        message_id = f"{self.queue}-{self.next}" if self.ledgers else None
        sender.send(Message(body=self.next, durable=True, id=message_id), timeout=self.send_timeout)
        with self._lock:
            self.confirmed[self.next] = time.monotonic()
        if self.ledgers:
            self.ledgers[0].confirmed(self.queue, message_id)
        self.next += 1

    def _send_failed(self, e: Exception) -> None:  # the same body is sent again
        self._error(f"send {self.next}: {type(e).__name__}: {e}")
        with self._lock:
            self.error_times.append(time.monotonic())

    def _consume(self) -> None:
        self._keep_going(self._stop_consumer, self._open_consumer, self._receive_one,
                         lambda e: self._error(f"receive: {type(e).__name__}: {e}"))

    def _open_consumer(self, conn: BlockingConnection) -> Any:
        return conn.create_receiver(self.queue, credit=self.credit)

    def _receive_one(self, receiver: Any) -> None:
        try:
            m = receiver.receive(timeout=0.5)
        except Timeout:
            return
        receiver.accept()
        with self._lock:
            self.received.append(m.body)
        if self.ledgers:
            self.ledgers[1].received(self.queue, m.id)

    # ---- observing ----------------------------------------------------------------------------
    def confirmed_count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def received_count(self) -> int:
        with self._lock:
            return len(self.received)

    def wait_confirmed(self, n: int, timeout: float) -> None:
        """Until n more publishes than now are confirmed (bounded)."""
        target = self.confirmed_count() + n
        deadline = time.monotonic() + timeout
        while self.confirmed_count() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.confirmed_count()}/{target} publishes confirmed within "
                                     f"{timeout} s; last errors: {self.errors[-5:]}")
            time.sleep(0.05)

    def recovery_after(self, t: float) -> float | None:
        """Seconds from monotonic time t (the failure) to the first publish confirmed after the
        producer noticed it (its first error after t): a settlement the old primary sent just
        before t does not count."""
        with self._lock:
            noticed = min((e for e in self.error_times if e > t), default=t)
            after = [c for c in self.confirmed.values() if c > noticed]
        return min(after) - t if after else None

    def outage_after(self, t: float) -> float | None:
        """Seconds between the producer's first failure after t and its next confirmed publish:
        how long the client could not publish."""
        with self._lock:
            noticed = min((e for e in self.error_times if e > t), default=None)
            if noticed is None:
                return 0.0
            after = [c for c in self.confirmed.values() if c > noticed]
        return min(after) - noticed if after else None

    def longest_stall(self, since: float, until: float) -> float:
        """The longest time between monotonic times `since` and `until` in which no publish was confirmed: the
        outage as the publishing application saw it, whenever the producer noticed it (a send on a connection
        the broker left without a word fails only at its timeout)."""
        with self._lock:
            times = sorted(t for t in self.confirmed.values() if since < t < until)
        edges = [since, *times, until]
        return max(b - a for a, b in zip(edges, edges[1:]))

    def step(self, action: Callable[[], Any], confirmed_after: int = 200, timeout: float = 30.0) -> dict[str, Any]:
        """Run `action` (a step of a rolling upgrade, a failover) under this load and wait until `confirmed_after`
        more publishes are confirmed; the client outage it caused, in seconds: `outage` from the producer's first
        failure to its next confirmed publish (`outage_after`), `stall` the longest time without a confirmed
        publish (`longest_stall`)."""
        began = time.monotonic()
        action()
        self.wait_confirmed(confirmed_after, timeout)
        outage = self.outage_after(began)
        return {"outage": None if outage is None else round(outage, 2),
                "stall": round(self.longest_stall(began, time.monotonic()), 2)}

    def assert_at_least_once(self) -> dict[str, Any]:
        """Once stopped: this load's report (`Load.report`'s, whatever a subclass's says), asserting that no
        confirmed publish was lost and that no more messages arrived twice than were in flight: the publish
        retried after each producer failure, and the consumer's credit of deliveries whose accept a stopped
        primary never passed on."""
        report = Load.report(self)
        assert report["confirmed"] > 0 and report["lost"] == [], f"confirmed but never received: {report}"
        assert len(report["duplicates"]) <= len(self.error_times) + self.credit, report
        return report

    def across(self, event: Callable[[], T], timeout: float = 30.0) -> tuple[T, dict[str, Any]]:
        """Start the load, let 300 publishes be confirmed and 100 received, run `event` (a failover), let
        300 more be confirmed, then wait until every confirmed message was received; the load is stopped
        whatever happens. Returns what `event` returned and the final report."""
        self.start()
        try:
            wait_for(lambda: self.confirmed_count() >= 300 and self.received_count() >= 100, timeout,
                     message="traffic before the event")
            result = event()
            base = self.confirmed_count()
            wait_for(lambda: self.confirmed_count() >= base + 300, timeout, message="300 confirmed after the event")
            self.stop_producer()
            wanted = set(self.confirmed)
            wait_for(lambda: wanted <= set(self.received), timeout,
                     message=f"every confirmed message received ({self.report()})")
        finally:
            self.stop()
        report = self.report()
        print("load report:", report)
        return result, report

    def stop_producer(self, timeout: float = 15.0) -> None:
        self._stop_producer.set()
        self.threads[0].join(timeout)

    def drain(self, timeout: float = 30.0) -> None:
        """Stop publishing, then wait until the consumer has received every publish confirmed (bounded)."""
        self.stop_producer()
        wanted = set(self.confirmed)
        wait_for(lambda: wanted <= set(self.received), timeout,
                 message=f"every confirmed message received ({self.report()})")

    def stop(self, timeout: float = 15.0) -> None:
        self._stop_producer.set()
        self._stop_consumer.set()
        for t in self.threads:
            t.join(timeout)
        for ledger in self.ledgers or ():
            ledger.close()

    def report(self) -> dict[str, Any]:
        with self._lock:
            counts = Counter(self.received)
            return {"confirmed": len(self.confirmed), "received": len(self.received),
                    "distinct": len(counts), "lost": sorted(set(self.confirmed) - set(counts)),
                    "duplicates": sorted(b for b, c in counts.items() if c > 1),
                    "errors": len(self.errors), "first_errors": self.errors[:5]}


def upgrade_report(load: Load, outages: dict[str, dict[str, Any]], how: str) -> dict[str, Any]:
    """The end of a rolling upgrade under `load` (stopped): no loss, no duplicate beyond what was in flight
    (Load.assert_at_least_once); prints bench/upgrade.py's summary line and each step's outage."""
    from releases import PREVIOUS, summary
    from haqueue import __version__
    report = load.assert_at_least_once()
    print("\n" + summary(PREVIOUS.version, __version__, report, outages.values()))
    print(f"{how} rolling upgrade {PREVIOUS.version} -> {__version__}: {report}; client outage per step: {outages}")
    return report


def features_enabled(data_dir: Path) -> list[str]:
    """The feature flags a broker last knew enabled in its cluster: ha-features.json in its data directory."""
    path = data_dir / "ha-features.json"
    return json.loads(path.read_text())["enabled"] if path.exists() else []


def enable_new_features(cli: Callable[..., Any], features: list[str]) -> None:
    """The last step of a rolling upgrade (design/upgrades.md) through `cli(*args)`, which runs `haqueue admin
    ARGS` at the primary: `cluster upgrade-check` says ok with `features` to enable, `cluster features enable`
    turns each on, and `cluster features` then lists them enabled."""
    def admin(*args: str) -> Any:
        proc = cli(*args)
        assert proc.returncode == 0, f"haqueue admin {' '.join(args)} exited with {proc.returncode}: {proc.stderr}"
        return json.loads(proc.stdout)
    check = admin("cluster", "upgrade-check")
    assert check["ok"] and check["features_to_enable"] == features, check
    for name in features:
        admin("cluster", "features", "enable", name)
    listed = admin("cluster", "features")["features"]
    assert {f["name"] for f in listed if f["enabled"]} >= set(features), listed


def _close(conn: BlockingConnection | None) -> None:
    """Close, ignoring errors (the broker may be gone: nothing to tidy); returns None."""
    if conn is not None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
