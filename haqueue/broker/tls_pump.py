"""One connection's TLS layer: Python's `ssl` over a MemoryBIO pair, beneath the broker's SASL layer
(design/security.md; tls.py makes the contexts). The socket's bytes go in and come out as plaintext;
plaintext goes in and the bytes for the socket come out through `emit`.
"""
from __future__ import annotations

import ssl
from typing import Callable, Final

from .tls import certificate_user

READ_SIZE: Final = 256 * 1024  # plaintext read at a time


class TlsPump:
    def __init__(self, context: ssl.SSLContext, server_side: bool, emit: Callable[[bytes], None]) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=server_side)
        self._server_side = server_side
        self._emit = emit  # takes bytes for the socket
        self.ready = False  # handshake done
        self._waiting = bytearray()  # what our side wrote before the handshake was done
        self.certificate_user: str | None = None  # the user the peer's verified certificate names

    def decrypt(self, data: bytes) -> bytes:
        """The plaintext that bytes from the socket complete. Raises SSLError if TLS fails."""
        self._in.write(data)
        chunks = []
        try:
            while self.ready or self.step():
                chunk = self._tls.read(READ_SIZE)
                if not chunk:
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        self.pump()
        return b"".join(chunks)

    def step(self) -> bool:
        """Take the handshake as far as the bytes so far allow; once done (True), learn who a client
        certificate names and send what waited for it. Raises SSLError if it fails."""
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self.pump()
            return False
        self.ready = True
        if self._server_side:
            self.certificate_user = certificate_user(self._tls.getpeercert())
        if self._waiting:
            self._tls.write(bytes(self._waiting))
            self._waiting.clear()
        self.pump()
        return True

    def write(self, data: bytes) -> None:
        """Plaintext to send: encrypted now, or once the handshake is done."""
        if not self.ready:
            self._waiting += data
        else:
            self._tls.write(data)
            self.pump()

    def pump(self) -> None:
        """Hand on what TLS has for the socket (records, a handshake message, an alert)."""
        if self._out.pending:
            self._emit(self._out.read())
