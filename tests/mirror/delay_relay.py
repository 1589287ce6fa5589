"""A TCP relay that puts two sites apart: each direction's bytes are held `delay` seconds before they go on (this
kernel has no netem), and `cut()` drops every connection and refuses new ones until `heal()` (a partition).

One thread accepts; each relayed connection has a reader and a writer thread per direction. A reader stamps each
chunk with the time it may leave; the writer sends it then, so the delay holds under load without slowing the
stream (bytes in flight are not limited: a long fat pipe).
"""
from __future__ import annotations

import queue
import socket
import threading
import time


class DelayRelay:
    def __init__(self, target: tuple[str, int], delay: float = 0.025, host: str = "127.0.0.1") -> None:
        """Relays what comes to `host` (an address of this machine's; a free port) to `target`."""
        self.target = target
        self.delay = delay
        self.listener = socket.create_server((host, 0))
        self.address = f"{host}:{self.listener.getsockname()[1]}"
        self.cutting = False
        self.closed = False
        self.accepted = 0  # connections relayed since start
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"relay-{self.address}", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cutting:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(src, chunks), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, chunks), daemon=True).start()

    def _read(self, src: socket.socket, chunks: "queue.Queue[tuple[float, bytes]]") -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def _write(self, dst: socket.socket, chunks: "queue.Queue[tuple[float, bytes]]") -> None:
        while True:
            due, data = chunks.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the delay itself, not a synchronisation
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        """Drop every relayed connection and refuse new ones."""
        self.cutting = True
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def heal(self) -> None:
        self.cutting = False

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.listener.close()
