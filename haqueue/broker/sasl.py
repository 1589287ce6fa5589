"""The server side of the AMQP SASL layer, run by the broker itself before proton sees a byte.

Doing SASL here (rather than through proton's Cyrus binding) lets the broker check PLAIN
against the users in its own config, know who each connection is (HA's admission needs it),
and accept clients that open with no SASL layer at all where anonymous access is allowed.
It is a cold path: a handful of frames per connection, decoded with proton's Data.
"""
from __future__ import annotations

import struct
from typing import Callable

from proton import Array, Data, Described, UNDESCRIBED, symbol, ubyte, ulong

from ..config import ANONYMOUS_USER

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"

_MECHANISMS, _INIT, _OUTCOME = 0x40, 0x41, 0x44
OK, AUTH_FAILED, SYS_ERROR = 0, 1, 2
_FRAME = struct.Struct(">IBBH")

# (mechanism, user, password, answer): calls answer(whether to admit), at once or later (a password
# hash checked off the loop: the connection then calls SaslServer.resume)
Authenticator = Callable[[str, str, str, Callable[[bool], None]], None]


def _fields(body: bytes, descriptor: int) -> list | None:
    """The fields of a SASL frame's body if it is the performative `descriptor`, else None."""
    data = Data()
    data.decode(body)
    data.rewind()
    data.next()
    frame = data.get_object()
    if not isinstance(frame, Described) or frame.descriptor != descriptor:
        return None
    if not isinstance(frame.value, list):
        return []
    # binary fields are views of the Data's memory, freed with it on return: copy them out
    return [bytes(v) if isinstance(v, memoryview) else v for v in frame.value]


def _frame(descriptor: int, fields: list) -> bytes:
    data = Data()
    data.put_object(Described(ulong(descriptor), fields))
    body = bytes(data.encode())
    return _FRAME.pack(8 + len(body), 2, 1, 0) + body


class SaslServer:
    """Feeds on the bytes after the SASL header; says when the exchange is over and who logged in.
    `certificate_user`: the user the client's verified TLS certificate names, who may log in with EXTERNAL."""

    def __init__(self, mechanisms: list[str], authenticate: Authenticator, certificate_user: str | None = None) -> None:
        self.mechanisms = (["EXTERNAL"] if certificate_user is not None else []) + mechanisms
        self.authenticate = authenticate
        self.certificate_user = certificate_user
        self.user: str | None = None
        self.done = False
        self.checking = False  # a password check is under way: bytes wait in the buffer
        self.failed: str | None = None  # why authentication failed
        self._buffer = b""

    def greeting(self) -> bytes:
        # proton annotates Array's descriptor without UNDESCRIBED, the value its own docs give for none
        mechs = Array(UNDESCRIBED, Data.SYMBOL, *[symbol(m) for m in self.mechanisms])  # type: ignore[arg-type]
        return SASL_HEADER + _frame(_MECHANISMS, [mechs])

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """(bytes to send, bytes that follow the SASL exchange)."""
        self._buffer += data
        out = b""
        while not self.done and not self.checking and len(self._buffer) >= 8:
            size, doff, ftype, _channel = _FRAME.unpack_from(self._buffer)
            if size < 8 or ftype != 1 or size > 65536:
                self.failed = f"malformed SASL frame (size {size}, type {ftype})"
                return out + _frame(_OUTCOME, [ubyte(SYS_ERROR)]), b""
            if len(self._buffer) < size:
                break
            body = self._buffer[doff * 4:size]
            self._buffer = self._buffer[size:]
            try:
                out += self._on_frame(body)
            except Exception as e:  # a hostile client's bytes: whatever decoding them raises refuses it alone
                self.failed = f"malformed SASL frame ({type(e).__name__}: {e})"
                return out + _frame(_OUTCOME, [ubyte(SYS_ERROR)]), b""
        rest = self._buffer if self.done else b""
        return out, rest

    def _on_frame(self, body: bytes) -> bytes:
        if not body:
            return b""  # an empty frame is a heartbeat
        init = _fields(body, _INIT)
        if init is None:
            self.failed = "expected sasl-init"
            return _frame(_OUTCOME, [ubyte(SYS_ERROR)])
        fields = init + [None, None]
        mechanism, response = str(fields[0]), fields[1] or b""
        self._check(mechanism, bytes(response))
        return self._outcome()

    def _check(self, mechanism: str, response: bytes) -> None:
        if mechanism not in self.mechanisms:
            self._decided(None, f"mechanism {mechanism} not offered")
        elif mechanism == "ANONYMOUS":
            self._ask("ANONYMOUS", ANONYMOUS_USER, "", "anonymous access is not allowed")
        elif mechanism == "EXTERNAL":
            self._external(response.decode("utf-8", "replace"))
        else:
            parts = response.split(b"\0")
            if len(parts) != 3:
                self._decided(None, "malformed PLAIN response")
                return
            user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
            self._ask("PLAIN", user, password, f"wrong user name or password for '{user}'")

    def _ask(self, mechanism: str, user: str, password: str, refusal: str) -> None:
        self.checking = True
        self.authenticate(mechanism, user, password, lambda ok: self._decided(user if ok else None, refusal))

    def _decided(self, user: str | None, refusal: str) -> None:
        self.checking = False
        self.done = True
        self.user = user
        if user is None:
            self.failed = refusal

    def _outcome(self) -> bytes:
        if self.checking:
            return b""
        return _frame(_OUTCOME, [ubyte(OK if self.user is not None else AUTH_FAILED)])

    def resume(self) -> tuple[bytes, bytes]:
        """Once a check that answered later is done: (the outcome to send, the bytes that followed)."""
        return self._outcome(), self._buffer if self.user is not None else b""

    def _external(self, wanted: str) -> None:
        """The TLS layer has verified the certificate (its CA vouches for the name): the client is that user.
        It may name the identity it wants (RFC 4422's authzid), but only the certificate's own."""
        if wanted and wanted != self.certificate_user:
            self._decided(None, f"EXTERNAL: the certificate of '{self.certificate_user}' cannot log in as '{wanted}'")
        else:
            self._decided(self.certificate_user, "")


class SaslClient:
    """The client side, for the broker's own outgoing connections (HA peers): PLAIN or ANONYMOUS."""

    def __init__(self, user: str | None, password: str | None) -> None:
        self.user = user
        self.password = password
        self.done = False
        self.failed: str | None = None
        self._buffer = b""
        self._header_seen = False

    def greeting(self) -> bytes:
        return SASL_HEADER

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """(bytes to send, bytes that follow the SASL exchange)."""
        self._buffer += data
        out = b""
        if not self._header_seen:
            if len(self._buffer) < 8:
                return b"", b""
            if self._buffer[:8] != SASL_HEADER:
                self.failed = f"peer answered with protocol header {self._buffer[:8]!r}, not SASL"
                return b"", b""
            self._header_seen = True
            self._buffer = self._buffer[8:]
        while not self.done and not self.failed and len(self._buffer) >= 8:
            size, doff, _ftype, _channel = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < size:
                break
            body = self._buffer[doff * 4:size]
            self._buffer = self._buffer[size:]
            if body:
                out += self._on_frame(body)
        return out, (self._buffer if self.done else b"")

    def _on_frame(self, body: bytes) -> bytes:
        mechanisms = _fields(body, _MECHANISMS)
        if mechanisms:
            listed = mechanisms[0]
            offered = [str(m) for m in (listed.elements if isinstance(listed, Array) else [listed])]
            mechanism = "PLAIN" if self.user else "ANONYMOUS"
            if mechanism not in offered:
                self.failed = f"peer does not offer {mechanism} (offers {', '.join(offered)})"
                return b""
            response = f"\0{self.user}\0{self.password}".encode() if self.user else b""
            return _frame(_INIT, [symbol(mechanism), response])
        outcome = _fields(body, _OUTCOME)
        if outcome:
            code = int(outcome[0])
            if code != OK:
                self.failed = f"authentication failed (SASL outcome {code})"
            else:
                self.done = True
        return b""
