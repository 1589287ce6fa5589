"""What build a peer runs and which replication protocol two peers use (design/upgrades.md).

Each end of a peer connection announces in its open frame its release, the protocols it speaks ([oldest, newest])
and the feature flags its build supports. They use the newest protocol both speak. Where there is none, the
connection is refused at once, with a message naming the broker to upgrade, and nothing is followed: a backup
that half-understood its primary could misplace what it replicates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import __version__
from . import protocol, test_hooks

UNANNOUNCED_RELEASE = "0.1.0"  # the one release that announced nothing (protocol 1)


@dataclass(frozen=True)
class Build:
    """A broker's build as it announced it."""

    name: str
    release: str
    oldest: int  # the protocols it speaks
    newest: int
    features: frozenset[str]

    def describe(self) -> dict[str, Any]:
        return {"release": self.release, "protocols": [self.oldest, self.newest], "features": sorted(self.features)}

    @property
    def protocols(self) -> str:
        return str(self.newest) if self.oldest == self.newest else f"{self.oldest}-{self.newest}"


def own(name: str, features: frozenset[str]) -> Build:
    oldest, newest = test_hooks.announced_protocols() or (protocol.OLDEST_PROTOCOL, protocol.PROTOCOL)
    return Build(name, __version__, oldest, newest, features)


def announcement(build: Build) -> dict[str, Any]:
    """What a broker says of its build in its open frame."""
    return {protocol.NAME: build.name, protocol.RELEASE: build.release,
            protocol.PROTOCOLS: [build.oldest, build.newest], protocol.FEATURES: sorted(build.features)}


def announced(properties: dict[Any, Any], fallback_name: str) -> Build:
    """A peer's build from its open frame's properties; one that says nothing is release 0.1.0 (protocol 1)."""
    protocols = properties.get(protocol.PROTOCOLS)
    if not protocols:
        return Build(fallback_name, UNANNOUNCED_RELEASE, 1, 1, frozenset())
    oldest, newest = (int(p) for p in list(protocols)[:2])
    return Build(str(properties.get(protocol.NAME) or fallback_name), str(properties.get(protocol.RELEASE) or "?"),
                 oldest, newest, frozenset(str(f) for f in properties.get(protocol.FEATURES) or ()))


def agreed(a: Build, b: Build) -> int | None:
    """The newest protocol both speak; None if they share none."""
    newest = min(a.newest, b.newest)
    return newest if newest >= max(a.oldest, b.oldest) else None


def refusal(backup: Build, primary: Build, enabled: frozenset[str], primary_role: str = "primary") -> str | None:
    """Why `backup` may not follow `primary` in a cluster with the feature flags `enabled` (None: it may), naming
    the broker to upgrade: the one whose protocols are older, or the one that lacks an enabled feature."""
    if agreed(backup, primary) is None:
        older = backup if backup.newest < primary.newest else primary
        return f"{backup.name} ({backup.release}) speaks replication protocol {backup.protocols}, {primary_role} " \
               f"{primary.name} ({primary.release}) speaks {primary.protocols}: upgrade {older.name}"
    for build, role in ((backup, "backup"), (primary, primary_role)):
        lacks = sorted(enabled - build.features)
        if lacks:
            return f"{role} {build.name} ({build.release}) lacks feature {', '.join(lacks)}, enabled in this " \
                   f"cluster: upgrade {build.name}"
    return None
