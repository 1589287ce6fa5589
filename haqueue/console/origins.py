"""Which other pages may call a console's API (CORS).

The page of one broker's console calls the others' when its own broker dies (design/console.md), so a console
answers pages of the cluster's own hosts (those in `ha.brokers`, `ha.public` and its listener's), and of
`http.allow_origins`. A page from anywhere else may call it only with a session token (a header, which the
browser never adds by itself): a site a user happens to visit cannot use an anonymous console in their name.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

WILDCARDS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("localhost",)
PREFLIGHT_HEADERS = [("Access-Control-Allow-Methods", "GET, POST, DELETE"),
                     ("Access-Control-Allow-Headers", "Authorization, Content-Type, X-CSRF-Token"),
                     ("Access-Control-Max-Age", "600")]


class Origins:
    def __init__(self, hosts: list[str], allowed: list[str]) -> None:
        self.hosts = {h for h in hosts if h not in WILDCARDS}
        if any(_loopback(h) for h in self.hosts):
            self.hosts.update(LOOPBACK_NAMES)
        self.allowed = set(allowed)

    def allows(self, origin: str, host_header: str, with_token: bool) -> bool:
        """Whether a request from a page of `origin` to this console (reached as `host_header`) is answered."""
        if with_token or origin in self.allowed:
            return True
        hostname = urlsplit(origin).hostname or ""
        return hostname in self.hosts or hostname == urlsplit(f"//{host_header}").hostname

    @staticmethod
    def headers(origin: str) -> list[tuple[str, str]]:
        return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in LOOPBACK_NAMES
