"""A blocking client for a broker's `$management` node (protocol: design/management.md)."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Iterator

from proton import Message, ProtonException, SSLDomain, Timeout, symbol
from proton.utils import BlockingConnection

from .config import TlsConfig
from .plain_container import PlainContainer

MANAGEMENT_ADDRESS = "$management"
# A connection property that says "an admin tool": a backup, which refuses clients, lets it in if its user
# may run admin operations (design/permissions.md).
ADMIN_TOOL = "x-haqueue-admin"


class AdminError(Exception):
    """The broker could not be reached, did not answer in time, or answered nonsense."""


class Refused(AdminError):
    """The broker answered with statusCode >= 400; the description says why."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(description or f"refused with status {code}")
        self.code = code


@dataclass
class Page:
    """One answer to a QUERY: its items, how many match in all, and where the next page starts (None: no more)."""

    items: list[dict[str, Any]]
    total: int
    next: str | None


class AdminClient:
    """One connection to a broker; `request` sends one management request and waits for its answer.
    With `tls` (a broker's peer listener under ha.tls), it presents tls's certificate and accepts the
    broker only with a certificate from tls.ca_file."""

    def __init__(self, address: str, timeout: float = 10.0, user: str | None = None,
                 password: str | None = None, tls: TlsConfig | None = None) -> None:
        self.address = address
        self.timeout = timeout
        self._credentials = (user, password, tls)
        # No user: skip SASL entirely, which a broker that lets anonymous clients in accepts.
        auth: dict[str, Any] = ({"sasl_enabled": False} if user is None else
                                {"allowed_mechs": "PLAIN", "user": user, "password": password or ""})
        if tls is not None:
            auth["ssl_domain"] = _ssl_domain(tls)
        self._conn: BlockingConnection | None = None
        self._unresponsive = False
        try:
            self._conn = BlockingConnection(f"{'amqps' if tls else 'amqp'}://{address}", timeout=timeout,
                                            container=PlainContainer(), properties={symbol(ADMIN_TOOL): True},
                                            **auth)
            self._sender = self._conn.create_sender(MANAGEMENT_ADDRESS)
            self._receiver = self._conn.create_receiver(None, dynamic=True)
        except Timeout as e:  # a broker stopped or hung: the kernel takes the connection, nobody answers
            self.close()
            raise AdminError(f"cannot connect to {address}: no answer within {timeout:g} s ({e})") from e
        except (ProtonException, OSError, ValueError) as e:
            self.close()
            raise AdminError(f"cannot connect to {address}: {e}") from e
        self._reply_to = self._receiver.remote_source.address
        if not self._reply_to:
            self.close()
            raise AdminError(f"{address} gave no address for the dynamic reply receiver")

    def request(self, operation: str, type: str, name: str | None = None,
                body: dict | None = None) -> tuple[int, str, Any]:
        """Send one request; returns (statusCode, statusDescription, body) of the answer."""
        properties: dict[str, Any] = {"operation": operation, "type": type}
        if name is not None:
            properties["name"] = name
        code, description, reply = self._ask(properties, body)
        return code, description, reply.body

    def query_page(self, type: str, count: int | None = None, offset: int = 0, after: str | None = None,
                   filter: str | None = None, body: dict | None = None) -> Page:
        """One page of a QUERY (design/management.md): the items whose names match `filter` (a glob), from
        `after` (an earlier page's `next`) and `offset` on, at most `count` (None: the broker's page size).
        Raises Refused if the broker refuses."""
        paging: dict[str, Any] = {"count": count, "offset": offset or None, "after": after, "filter": filter}
        properties: dict[str, Any] = {"operation": "QUERY", "type": type, **{k: v for k, v in paging.items() if v is not None}}
        code, description, reply = self._ask(properties, body)
        if code >= 400:
            raise Refused(code, description)
        items = list(reply.body) if isinstance(reply.body, list) else []
        answer: dict[Any, Any] = reply.properties or {}
        return Page(items, int(answer.get("total", len(items))), answer.get("next"))

    def query(self, type: str, filter: str | None = None, body: dict | None = None, offset: int = 0,
              limit: int | None = None) -> Iterator[dict[str, Any]]:
        """Every item a QUERY matches (or `limit` of them from `offset` on), in the broker's order, a page at a
        time. Each page starts after the last item of the one before, not at an offset: an item that exists
        throughout is listed once, whatever is declared or deleted meanwhile."""
        after = None
        while limit is None or limit > 0:
            page = self.query_page(type, limit, offset, after, filter, body)
            yield from page.items
            if page.next is None:
                return
            if limit is not None:
                limit -= len(page.items)
            after, offset = page.next, 0

    def _ask(self, properties: dict[str, Any], body: Any) -> tuple[int, str, Message]:
        """Send one request; (statusCode, statusDescription, the answer)."""
        if self._conn is None:
            raise AdminError("the connection is closed")
        name = properties.get("name")
        what = f"{properties['operation']} {properties['type']}" + (f" {name!r}" if name is not None else "")
        request_id = str(uuid.uuid4())
        message = Message(id=request_id, reply_to=self._reply_to, properties=properties, body=body)
        deadline = time.monotonic() + self.timeout
        try:
            self._sender.send(message)
            while True:
                reply = self._receiver.receive(timeout=max(deadline - time.monotonic(), 0.001))
                self._receiver.accept()
                # An answer to an earlier request that timed out may still arrive: skip it.
                if reply.correlation_id == request_id:
                    break
        except Timeout as e:
            self._unresponsive = True
            raise AdminError(f"{self.address}: no answer to {what} within {self.timeout:g} s") from e
        except ProtonException as e:
            self._unresponsive = True
            raise AdminError(f"{self.address}: {what} failed: {e}") from e
        answer: dict[Any, Any] = reply.properties or {}
        code = answer.get("statusCode")
        if not isinstance(code, int) or isinstance(code, bool):
            raise AdminError(f"{self.address}: the answer to {what} has no statusCode")
        return int(code), str(answer.get("statusDescription", "")), reply

    def elsewhere(self, address: str) -> AdminClient:
        """A client of another broker, with this one's timeout, user and TLS."""
        return AdminClient(address, self.timeout, *self._credentials)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                transport = conn.conn.transport if conn.conn is not None else None
                if self._unresponsive and transport is not None:
                    # A hung broker never answers our close, and proton would wait for it forever.
                    transport.close_tail()
                    transport.close_head()
                conn.close()
            except ProtonException:
                pass  # the broker is gone already; nothing is left to tidy up

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _ssl_domain(tls: TlsConfig) -> SSLDomain:
    """As a peer broker connects (broker/tls.py): our certificate, the broker's checked against the CA, not its name."""
    if not tls.ca_file:
        raise AdminError("TLS needs a CA file to verify the broker's certificate with")
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    try:
        domain.set_credentials(tls.cert_file, tls.key_file, None)
        domain.set_trusted_ca_db(tls.ca_file)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    except ProtonException as e:
        raise AdminError(f"cannot use the certificate {tls.cert_file}, key {tls.key_file} or CA {tls.ca_file}: {e}") \
            from e
    return domain
