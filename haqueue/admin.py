"""A blocking client for a broker's `$management` node (protocol: design/management.md)."""
from __future__ import annotations

import time
import uuid
from types import TracebackType
from typing import Any

from proton import Message, ProtonException, SSLDomain, Timeout, symbol
from proton.utils import BlockingConnection

from .config import TlsConfig

MANAGEMENT_ADDRESS = "$management"
# A connection property that says "an admin tool": a backup, which refuses clients, lets it in if its user
# may run admin operations (design/permissions.md).
ADMIN_TOOL = "x-haqueue-admin"


class AdminError(Exception):
    """The broker could not be reached, did not answer in time, or answered nonsense."""


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
                                            properties={symbol(ADMIN_TOOL): True}, **auth)
            self._sender = self._conn.create_sender(MANAGEMENT_ADDRESS)
            self._receiver = self._conn.create_receiver(None, dynamic=True)
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
        if self._conn is None:
            raise AdminError("the connection is closed")
        what = f"{operation} {type}" + (f" {name!r}" if name is not None else "")
        properties: dict[str, Any] = {"operation": operation, "type": type}
        if name is not None:
            properties["name"] = name
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
        properties = reply.properties or {}
        code = properties.get("statusCode")
        if not isinstance(code, int) or isinstance(code, bool):
            raise AdminError(f"{self.address}: the answer to {what} has no statusCode")
        return int(code), str(properties.get("statusDescription", "")), reply.body

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
