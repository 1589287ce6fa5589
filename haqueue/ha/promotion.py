"""A request to promote this backup (`haqueue admin ha promote`, the console's button, the local supervisor,
Pacemaker's agent), under the external coordinator: refused while the backup follows a primary that is
serving, with or without --force.

A backup follows a primary only while their connection lives, and that connection has a heartbeat
(backup.HEARTBEAT): a primary that died, hung or was cut off is let go within it. A coordinator promotes
once it has stopped, demoted or lost the old primary, so the backup may still hold the connection for a
moment (a kill's FIN not read yet, a partition not noticed yet): the request waits that long for it to go
before it is refused. A primary still heard from after that is serving, and a second primary beside it is
what no flag should make: --force overrides readiness (what this backup may lack), never that. Under the
ZooKeeper coordinator the election decides and its own handler answers (coord/zookeeper.py).
"""
from __future__ import annotations

import time
from typing import Any, Protocol

from ..broker.errors import BrokerError, NOT_ALLOWED
from ..broker.management import Answer, failure, when_clear
from ..broker.server import Broker
from .backup import HEARTBEAT, Backup
from .primary import Primary
from .role import EpochStore

LET_GO = HEARTBEAT + 1.0  # seconds within which a backup lets go of a primary that is gone


class PromotionHost(Protocol):
    """What promotion requests need of the HaBroker (ha_broker.HaBroker): they never import it."""

    broker: Broker
    backup: Backup
    primary: Primary | None
    epoch: EpochStore

    def promote(self, force: bool = False, epoch: int | None = None) -> dict[str, Any]:
        """Make this backup the primary (refused unless ready, without `force`); its status."""


class PromotionRequests:
    """The `ha PROMOTE` management operation, answered once the backup follows no primary (or LET_GO passed)."""

    def __init__(self, ha: PromotionHost) -> None:
        self.ha = ha
        management = ha.broker.management
        # What a plug-in applies itself (Management.handle): at once.
        management.register("ha", "PROMOTE", lambda name, body: (200, ha.promote(bool(body.get("force")))))
        management.deferred[("ha", "PROMOTE")] = self.request

    def request(self, name: str | None, body: dict[str, Any], user: str | None, answer: Answer) -> None:
        ha = self.ha
        force = bool(body.get("force"))
        when_clear(ha.broker.engine.call_later, lambda: ha.backup.primary if ha.primary is None else None,
                   time.monotonic() + LET_GO, lambda followed: self._answer(force, followed, answer))

    def _answer(self, force: bool, followed: str | None, answer: Answer) -> None:
        ha = self.ha
        try:
            if followed is not None:
                raise BrokerError(NOT_ALLOWED, f"{ha.broker.name} cannot be promoted: it follows {followed}, the "
                                               f"primary of epoch {ha.epoch.epoch}, which is serving (heard from "
                                               f"within {HEARTBEAT:g}s); stop or demote {followed} first: a "
                                               f"second primary is never made, even with --force")
            answer(200, "OK", ha.promote(force))
        except Exception as e:  # noqa: BLE001 - answered, never raised into the loop
            answer(*failure(e), None)
