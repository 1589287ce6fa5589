"""What a connection says before AMQP: the protocol headers and the SASL exchange (sasl.py holds its
frames). A connection the broker accepted reads a header, perhaps SASL and then the AMQP header; one it
opened (an HA peer) logs in with SaslClient. Once over, the connection's phase is "amqp" and its bytes go
to proton; a refusal closes it after the client has read why.
"""
from __future__ import annotations

from logging import WARNING
from typing import TYPE_CHECKING, Callable

from .sasl import AMQP_HEADER, SASL_HEADER, SaslClient, SaslServer

if TYPE_CHECKING:
    from .connection import Connection


class Preamble:
    def __init__(self, conn: "Connection", sasl_client: SaslClient | None = None) -> None:
        self.conn = conn
        self.header = b""
        self.sasl: SaslServer | SaslClient | None = sasl_client

    def feed(self, data: bytes) -> bytes:
        """Take bytes read before AMQP; return those that belong to AMQP (its header first)."""
        conn = self.conn
        if conn.phase == "sasl":
            assert self.sasl is not None
            out, rest = self.sasl.feed(data)
            return self._sasl_progress(out, rest)
        self.header += data
        if len(self.header) < 8:
            return b""
        header, rest = self.header[:8], self.header[8:]
        assert conn.listener is not None  # only a connection the broker accepted reads a protocol header
        options = conn.listener.options
        engine = conn.engine
        if header == SASL_HEADER and conn.user is None:
            certificate_user = conn.tls.certificate_user if conn.tls is not None else None
            self.sasl = SaslServer(conn.listener.mechanisms(engine.anonymous), self._authenticate, certificate_user)
            conn.phase = "sasl"
            conn.write_plain(self.sasl.greeting())
            return self.feed(rest) if rest else b""
        if header == AMQP_HEADER:
            if conn.user is None:
                if options.sasl == "required" or not engine.anonymous:
                    engine.refusal_log(WARNING, conn.peer, "no SASL", "connection %s refused: SASL is "
                                       "required on %s:%s", conn.peer, options.host, options.port)
                    conn.write_plain(SASL_HEADER)
                    conn.close_after_write()
                    return b""
                conn.user = "anonymous"
            conn.phase = "amqp"
            return header + rest
        engine.refusal_log(WARNING, conn.peer, f"header {header!r}", "connection %s refused: bad protocol header %r",
                           conn.peer, header)
        conn.write_plain(SASL_HEADER if options.sasl == "required" else AMQP_HEADER)
        conn.close_after_write()
        return b""

    def _authenticate(self, mechanism: str, user: str, password: str, answer: Callable[[bool], None]) -> None:
        def later(ok: bool) -> None:
            answer(ok)
            self._sasl_answered()
        self.conn.engine.password_checks.check(mechanism, user, password, answer, later)

    def _sasl_answered(self) -> None:
        """A password checked off the loop has its answer: the SASL exchange goes on."""
        if self.conn.closed or not isinstance(self.sasl, SaslServer):
            return
        data = self._sasl_progress(*self.sasl.resume())
        if data:
            self.conn.push(data)

    def _sasl_progress(self, out: bytes, rest: bytes) -> bytes:
        """Send what the SASL layer answered; once it is over, the bytes after it go on."""
        assert self.sasl is not None
        conn = self.conn
        if out:
            conn.write_plain(out)
        if conn.client is not None:
            return self._after_client_sasl(rest)
        if not (self.sasl.done or self.sasl.failed):  # more frames to come, or a check under way
            return b""
        if self.sasl.user is None:
            reason = self.sasl.failed or "authentication failed"
            conn.engine.refusal_log(WARNING, conn.peer, reason, "connection %s refused: %s", conn.peer, reason)
            # Let the client read the outcome and close first: closing at once makes proton
            # report a framing error instead of the authentication failure.
            conn.phase = "refused"
            conn.engine.call_later(1.0, conn.abort)
            return b""
        conn.user = self.sasl.user
        conn.phase = "header"
        self.header = b""
        return self.feed(rest) if rest else b""

    def _after_client_sasl(self, rest: bytes) -> bytes:
        assert isinstance(self.sasl, SaslClient)
        conn = self.conn
        if self.sasl.failed:
            conn.engine.refusal_log(WARNING, conn.peer, self.sasl.failed, "connection to %s: %s", conn.peer,
                                    self.sasl.failed)
            conn.client_error = self.sasl.failed
            conn.abort()
            return b""
        if not self.sasl.done:
            return b""
        conn.phase = "amqp"  # proton's client transport now writes the AMQP header and open
        conn.proton.open_client()
        conn.engine.dirty.add(conn)
        return rest
