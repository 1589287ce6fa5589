"""The console's HTTP(S) listener: a thread per connection, bounded in number, in request size and in time, so a
client sending too much, too slowly or nonsense gets an answer saying so (413, 408, 400) and the broker goes on
serving. Requests are answered by the app (api.py); this module only speaks HTTP."""
from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl, urlsplit

log = logging.getLogger("haqueue.console")

MAX_BODY = 64 * 1024  # bytes of a request's body (a declare's arguments fit many times over)
MAX_CONNECTIONS = 64  # open at once; one more is answered 503 and closed
IDLE_SECONDS = 15.0  # a connection that sends nothing for this long is closed (a slow client holds no thread)


@dataclass
class Request:
    method: str
    path: str  # as sent, still %-encoded: a name may hold a '/'
    query: dict[str, str]
    headers: Any  # http.client.HTTPMessage: case-insensitive
    body: bytes
    host: str  # the Host header: the origin the page was loaded from
    client: str  # the address the request came from, for the log


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


App = Callable[[Request], Reply]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a page polling every second reuses its connection
    default_request_version = "HTTP/1.0"  # what a malformed request line is answered in (0.9 has no status line)
    server_version = "haqueue-console"
    timeout = IDLE_SECONDS
    server: "ConsoleServer"

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()  # here, on this connection's thread, not in the accept loop
            except (ssl.SSLError, OSError) as e:
                log.info("console: TLS handshake with %s failed: %s", self.client_address[0], e)
                self.close_connection = True
                raise _Dropped() from e

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self._reply(Reply(411, _error("send a Content-Length, not a chunked body")))
            return
        if length is not None and not (length.isascii() and length.isdigit()):
            self._reply(Reply(400, _error(f"bad Content-Length {length!r}")))
            return
        size = int(length or 0)
        if size > MAX_BODY:
            self.close_connection = True  # what it still sends is not read
            self._reply(Reply(413, _error(f"the request's body is {size} bytes; at most {MAX_BODY} are taken")))
            return
        try:
            body = self.rfile.read(size) if size else b""
        except (TimeoutError, socket.timeout):
            self.close_connection = True
            self._reply(Reply(408, _error(f"the body did not arrive within {IDLE_SECONDS:g} s")))
            return
        split = urlsplit(self.path)
        request = Request(self.command, split.path, dict(parse_qsl(split.query)), self.headers, body,
                          self.headers.get("Host", ""), self.client_address[0])
        self._reply(self.server.app(request))

    do_GET = do_POST = do_DELETE = do_OPTIONS = do_HEAD = _serve

    def _reply(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        for name, value in reply.headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's own refusals (a malformed request line, headers too long: 400, 414, 431) as JSON."""
        self.close_connection = True
        try:
            self._reply(Reply(code, _error(message or explain or "bad request")))
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per poll would drown the broker's log


class _Dropped(Exception):
    """The connection was given up before a request (a failed TLS handshake)."""


class ConsoleServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: App, tls: ssl.SSLContext | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.app = app
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                body = _error(f"the console serves at most {MAX_CONNECTIONS} connections at once; try again")
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer, or a failed handshake: nothing for the broker's log


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
