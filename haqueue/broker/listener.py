"""A listening socket: the address it binds, its TLS context and the SASL mechanisms it offers."""
from __future__ import annotations

import errno
import logging
import socket
import ssl
from typing import Iterator

from ..config import ListenerConfig

log = logging.getLogger("haqueue.engine")

# Connections the kernel completes and queues before the broker accepts them. A storm of clients (every one
# reconnecting after a failover) fills a queue of 1,024 in milliseconds; the kernel then drops their SYNs and
# each client waits out a retransmit (1 s, then 3 s, 7 s...). The kernel caps this at net.core.somaxconn.
LISTEN_BACKLOG = 65535


class Listener:
    def __init__(self, options: ListenerConfig, tls_context: ssl.SSLContext | None) -> None:
        self.options = options
        self.tls_context = tls_context
        self.sock = socket.socket(socket.AF_INET6 if ":" in options.host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if options.reuse_port:  # the kernel spreads the address's connections over every process bound to it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            self.sock.bind((options.host, options.port))
        except OSError as e:
            self.sock.close()
            raise OSError(e.errno, f"cannot listen on {options.host}:{options.port}: {e.strerror}") from None
        self.sock.listen(LISTEN_BACKLOG)
        self.sock.setblocking(False)

    def mechanisms(self, anonymous: bool) -> list[str]:
        """What this listener offers: PLAIN always, ANONYMOUS where the broker allows it and SASL is optional."""
        mechs = ["PLAIN"]
        if self.options.sasl == "optional" and anonymous:
            mechs.append("ANONYMOUS")
        return mechs

    def accept(self) -> Iterator[tuple[socket.socket, str]]:
        """Each connection waiting (non-blocking, without Nagle's delay) and its peer's address, until none is."""
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    log.error("cannot accept a connection: %s", e)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                peer = "%s:%s" % sock.getpeername()[:2]
            except OSError:
                sock.close()
                continue
            yield sock, peer
