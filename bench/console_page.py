"""An open console page, as far as the broker can tell: a thread asking the console's API what the page asks every
second (the overview and the queue table sorted by depth), for the benchmark of what the console costs
(bench/interleave.py's `+page` set-ups; design/console.md)."""
from __future__ import annotations

import json
import threading
import urllib.request

EVERY = 1.0  # seconds, as the page's refresh
PATHS = ("/api/overview", "/api/queues?sort=depth&order=desc&limit=50")


class PagePoller(threading.Thread):
    def __init__(self, console: str) -> None:
        super().__init__(name="console-page", daemon=True)
        self.console = console.rstrip("/")
        self.stopping = threading.Event()
        self.requests = self.errors = 0
        self.last_error: str | None = None

    def run(self) -> None:
        while not self.stopping.wait(EVERY):
            for path in PATHS:
                try:
                    with urllib.request.urlopen(self.console + path, timeout=5) as response:
                        json.load(response)
                    self.requests += 1
                except (OSError, ValueError) as e:
                    self.errors += 1
                    self.last_error = f"{path}: {e}"

    def stop(self) -> str:
        self.stopping.set()
        self.join(5)
        return f"{self.requests} requests, {self.errors} failed" + (f" (last: {self.last_error})" if self.errors else "")
