"""`haqueue admin mirror promote` on a standby (design/mirroring.md, "Epochs and fencing"): its mirror queues become
writable, and its mirror epoch rises above every source's it accepted, kept durably (epoch.py): from then on a
source that comes back is refused, the epoch named, and cannot feed it silently.

Refused while a source may be serving: its mirror is connected here, or was within target.SOURCE_GONE (a source
still running is back by then). As `ha promote`, the request first waits that long for it to go (a source lost a
moment ago may not be noticed yet), then is refused, unless --force: a forced promotion ends the sources'
connections here, and fences them off. The answer comes once the standby's guards (disk, backups) hold the epoch.
"""
from __future__ import annotations

import time
from typing import Any

from ..broker.completion import Completion
from ..broker.errors import BrokerError, NOT_ALLOWED
from ..broker.management import Answer, failure, when_clear
from .target import SOURCE_GONE, MirrorTarget


class PromotionRequests:
    """The `mirror PROMOTE` management operation (an admin's)."""

    def __init__(self, target: MirrorTarget) -> None:
        self.target = target
        management = target.broker.management
        # What a plug-in applies itself (Management.handle): at once, without waiting for anything.
        management.register("mirror", "PROMOTE", self._at_once)
        management.deferred[("mirror", "PROMOTE")] = self.request

    def _at_once(self, name: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.target.promote()
        return 200, self.target.status()

    def request(self, name: str | None, body: dict[str, Any], user: str | None, answer: Answer) -> None:
        target = self.target
        serving = (lambda: None) if body.get("force") else target.serving
        when_clear(target.broker.engine.call_later, serving, time.monotonic() + SOURCE_GONE,
                   lambda source: self._answer(source, answer))

    def _answer(self, serving: str | None, answer: Answer) -> None:
        target = self.target
        try:
            if serving is not None:
                raise BrokerError(NOT_ALLOWED, f"{target.broker.name} cannot be promoted: {serving}, and may be "
                                               f"serving still; stop it or cut the site link first, or promote "
                                               f"with --force (it is then fenced off)")
            target.promote(Completion(lambda: answer(200, "OK", target.status())))
        except Exception as e:  # noqa: BLE001 - answered, never raised into the loop
            answer(*failure(e), None)
