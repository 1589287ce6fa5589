"""`haqueue admin mirror promote` and `reverse` on a standby (design/mirroring.md, "Epochs and fencing").

Promote: its mirror queues become
writable, and its mirror epoch rises above every source's it accepted, kept durably (epoch.py): from then on a
source that comes back is refused, the epoch named, and cannot feed it silently.

Refused while a source may be serving: its mirror is connected here, or was within target.SOURCE_GONE (a source
still running is back by then). As `ha promote`, the request first waits that long for it to go (a source lost a
moment ago may not be noticed yet), then is refused, unless --force: a forced promotion ends the sources'
connections here, and fences them off. The answer comes once the standby's guards (disk, backups) hold the epoch.

Reverse (fail-back), on a promoted standby: it mirrors back to the cluster it was promoted over, as a source at the
epoch above its promotion's; there its queues become this cluster's mirrors (reverse.py).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..broker.completion import Completion
from ..broker.errors import BrokerError, NOT_ALLOWED
from ..broker.management import Answer, failure, when_clear
from .epoch import EpochRecord
from .target import SOURCE_GONE, MirrorTarget, source_of

log = logging.getLogger("haqueue.mirror")


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


class ReverseRequests:
    """The `mirror REVERSE` management operation (an admin's), on a promoted standby whose mirror section names the
    old source (mirror.to): the epoch rises above the promotion's, kept as the promotion's was (answered once the
    standby's guards hold it), and the source (source.py, told by the record) mirrors at it, naming the cluster it
    reverses onto."""

    def __init__(self, target: MirrorTarget, record: EpochRecord, can_mirror: bool) -> None:
        self.target = target
        self.record = record
        self.can_mirror = can_mirror  # this broker's mirror section names where to (mirror.to)
        management = target.broker.management
        management.register("mirror", "REVERSE", self._at_once)
        management.deferred[("mirror", "REVERSE")] = self.request

    def _at_once(self, name: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.reverse(body.get("of"), None)
        return 200, self.target.status()

    def request(self, name: str | None, body: dict[str, Any], user: str | None, answer: Answer) -> None:
        try:
            self.reverse(body.get("of"), Completion(lambda: answer(200, "OK", self.target.status())))
        except Exception as e:  # noqa: BLE001 - answered, never raised into the loop
            answer(*failure(e), None)

    def reverse(self, of: str | None, confirmed: Completion | None) -> None:
        target = self.target
        name = target.broker.name
        if target.ha is not None and target.ha.primary is None:
            raise BrokerError(NOT_ALLOWED, f"{name} is not its cluster's primary: reverse the mirror there")
        known = self.record.read()
        if not known.promoted:
            raise BrokerError(NOT_ALLOWED, f"{name}'s cluster is not a promoted standby: promote it first "
                                           f"(haqueue admin mirror promote)")
        if known.reverses is not None:
            raise BrokerError(NOT_ALLOWED, f"{name}'s cluster mirrors back to cluster '{known.reverses}' already, at "
                                           f"mirror epoch {known.epoch}")
        if not self.can_mirror:
            raise BrokerError(NOT_ALLOWED, f"{name}'s mirror section names no cluster to mirror back to: give it the "
                                           f"old source's address (mirror.to, username, password, queues)")
        sources = sorted({s for s in map(source_of, target.broker.registry.queues()) if s is not None})
        if of is None and len(sources) != 1:
            raise BrokerError(NOT_ALLOWED, f"{name} holds mirrors of {len(sources)} clusters ({', '.join(sources)}): "
                                           f"name the one to mirror back to (--of)")
        cluster = of if of is not None else sources[0]
        if cluster not in sources:
            raise BrokerError(NOT_ALLOWED, f"{name} holds no mirror of cluster '{cluster}' (it has: "
                                           f"{', '.join(sources) or 'none'})")
        reversed_ = known.reverse(cluster)
        self.record.write(reversed_, confirmed)
        log.warning("mirror: %s's cluster mirrors back to cluster %s at mirror epoch %d: its queues there become "
                    "mirrors of these", name, cluster, reversed_.epoch)

