"""The pages: static files shipped in the package (static/), with the charting library `make setup` copies
from npm into static/vendor/ (not in git). The pages hold no data: anyone may load them; the API they call
needs a login where the config asks for one."""
from __future__ import annotations

import mimetypes
import os
from urllib.parse import unquote

from .http_server import Reply

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "static"))
INDEX = "index.html"
# Paths a browser asks for without a link to them: the page, and the icon (an SVG, which browsers take there too).
ALIASES = {"/": "/static/" + INDEX, "/" + INDEX: "/static/" + INDEX, "/favicon.ico": "/static/favicon.svg"}
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
SECURITY = [("Content-Security-Policy", "default-src 'self'; connect-src *; img-src 'self' data: blob:; "
                                        "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"),
            ("Referrer-Policy", "no-referrer")]


class StaticFiles:
    def reply(self, path: str) -> Reply:
        path = ALIASES.get(path, path)
        full = os.path.realpath(os.path.join(ROOT, unquote(path.removeprefix("/static/"))))
        if not path.startswith("/static/") or not full.startswith(ROOT + os.sep) or not os.path.isfile(full):
            return Reply(404, b"not found\n", "text/plain")
        with open(full, "rb") as f:
            body = f.read()
        extension = os.path.splitext(full)[1]
        kind = TYPES.get(extension) or mimetypes.guess_type(full)[0] or "application/octet-stream"
        return Reply(200, body, kind, list(SECURITY))
