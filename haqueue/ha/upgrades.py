"""The management operations of a rolling upgrade (design/upgrades.md): the cluster's feature flags (`features`
READ and ENABLE) and whether the cluster can take the next step of an upgrade (`upgrade-check` READ). A primary
answers for the cluster; a backup sends the caller to its primary.
"""
from __future__ import annotations

from typing import Any, Protocol

from ..broker.errors import BrokerError, NOT_ALLOWED, NOT_FOUND
from ..broker.server import Broker
from ..config import HaConfig
from .backup import Backup
from .features import SUPPORTED, FeatureFlags
from .primary import Primary
from .role import READY
from .versions import Build


class UpgradeHost(Protocol):
    """What these operations need of the HaBroker (ha_broker.HaBroker): they never import it."""

    broker: Broker
    config: HaConfig
    backup: Backup
    primary: Primary | None
    features: FeatureFlags
    build: Build
    protocol_refusals: dict[str, str]


class Upgrades:
    def __init__(self, ha: UpgradeHost) -> None:
        self.ha = ha
        management = ha.broker.management
        management.register("features", "READ", lambda name, body: (200, self.features()))
        management.register("features", "ENABLE", lambda name, body: (200, self.enable(str(name or ""))))
        management.register("upgrade-check", "READ", lambda name, body: (200, self.check()))

    def _primary(self, what: str) -> Primary:
        primary = self.ha.primary
        if primary is None:
            followed = self.ha.backup.primary
            where = f"its primary, {followed}" if followed else "the primary (it follows none now)"
            raise BrokerError(NOT_ALLOWED, f"{self.ha.broker.name} is a backup: ask {where}, to {what}")
        return primary

    def _members(self, primary: Primary) -> dict[str, Build | None]:
        """Each member's build: this primary's, its backups' as they announced them."""
        return {self.ha.broker.name: self.ha.build, **{b.name: b.build for b in primary.backups.values()}}

    def _absent(self, primary: Primary) -> int:
        """Members of ha.brokers that do not follow this primary now."""
        return max(0, len(self.ha.config.brokers) - 1 - len(primary.backups))

    def features(self) -> dict[str, Any]:
        primary = self._primary("list the cluster's features")
        members = self._members(primary)
        supported = {name: None if build is None else build.features for name, build in members.items()}
        return {"features": self.ha.features.describe(supported), "members_absent": self._absent(primary)}

    def enable(self, name: str) -> dict[str, Any]:
        if name not in SUPPORTED:
            raise BrokerError(NOT_FOUND, f"no feature '{name}': this build has {', '.join(sorted(SUPPORTED))}")
        primary = self._primary(f"enable {name}")
        if not self.ha.features.on(name):
            absent = self._absent(primary)
            if absent:
                raise BrokerError(NOT_ALLOWED, f"cannot enable {name}: {absent} of the {len(self.ha.config.brokers)} "
                                               f"members in ha.brokers do not follow this primary now; a feature is "
                                               f"enabled only while every member is here to say it supports it")
            lacking = sorted(f"{member} ({build.release})" if build else member
                             for member, build in self._members(primary).items()
                             if build is None or name not in build.features)
            if lacking:
                raise BrokerError(NOT_ALLOWED, f"cannot enable {name}: {', '.join(lacking)} does not support it; "
                                               f"upgrade to {SUPPORTED[name].since} or newer first")
            self.ha.features.set(self.ha.features.enabled | {name})
            primary.features_changed()
        return self.features()

    def check(self) -> dict[str, Any]:
        """Whether the cluster can take the next step of a rolling upgrade: every member here and ready, every
        peer speaking a protocol this one shares; and which features every member now supports but are off."""
        primary = self._primary("check the cluster")
        blockers = [f"refused peer: {reason}" for reason in self.ha.protocol_refusals.values()]
        absent = self._absent(primary)
        if absent:
            blockers.append(f"{absent} of the {len(self.ha.config.brokers)} members in ha.brokers do not follow "
                            f"this primary now")
        blockers += [f"backup {b.name} is {b.state}, not ready" for b in primary.backups.values() if b.state != READY]
        members = self._members(primary)
        ready_to_enable = sorted(name for name in SUPPORTED if not self.ha.features.on(name) and not absent
                                 and all(b is not None and name in b.features for b in members.values()))
        return {"ok": not blockers, "blockers": blockers, "primary": self.ha.broker.name,
                "members": {name: b.describe() if b else None for name, b in members.items()},
                "protocols": {b.name: b.protocol for b in primary.backups.values()},
                "features_to_enable": ready_to_enable}
