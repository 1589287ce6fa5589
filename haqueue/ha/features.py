"""Feature flags (design/upgrades.md): a change to what goes on the wire or on disk that an older build could
not read is switched on for the whole cluster at once, and only once every member supports it, so a cluster
in the middle of a rolling upgrade never writes what one of its members cannot read.

The primary holds the cluster's enabled set and sends it to its backups on the wiring link (protocol 2 on);
each broker keeps the set it last knew in its data dir. A brand-new cluster starts with every feature its first
primary supports; a cluster upgraded from a release before feature flags starts with none, and an operator
enables each once every member runs a release that supports it (`haqueue admin cluster features enable`):
enabling one ends the way back to a release without it, which is why it is not done by itself. Once enabled, a
feature stays enabled, and a peer that lacks it is refused at open like one that shares no protocol.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Final, Iterable

from .. import formats

log = logging.getLogger("haqueue.ha.features")

FILE: Final = "ha-features.json"
FORMAT: Final = 1  # of FILE


@dataclass(frozen=True)
class Feature:
    name: str
    since: str  # the first release that supports it
    description: str


DIVERGED_FILE_HEADER: Final = "diverged-file-header"  # quarantine.py writes format 2 once it is enabled
MIRROR: Final = "mirror"  # a standby takes a mirror only once it is enabled (mirror/target.py)

SUPPORTED: Final = {f.name: f for f in (
    Feature(DIVERGED_FILE_HEADER, "0.2.0",
            "diverged files (data_dir/diverged/) begin with a header naming their format; 0.1.0's `haqueue diverged` "
            "cannot read them"),
    Feature(MIRROR, "0.2.0",
            "a standby cluster takes a mirror of another cluster's queues (design/mirroring.md); a 0.1.0 member, "
            "promoted, would serve those queues read-write and take no more of the mirror"),
)}


def missing(enabled: Iterable[str], features: frozenset[str]) -> list[str]:
    """The enabled features a build that supports `features` lacks."""
    return sorted(set(enabled) - features)


class FeatureFlags:
    """The features enabled in this broker's cluster, as it last knew; `known` is False until it has known any
    (no file yet: a broker of a new cluster, or one upgraded from a release before feature flags)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, FILE)
        self.enabled: frozenset[str] = frozenset()
        self.known = os.path.exists(self.path)
        if self.known:
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            formats.check_document(self.path, saved, FORMAT)
            self.enabled = frozenset(str(name) for name in saved.get("enabled", ()))

    def on(self, name: str) -> bool:
        return name in self.enabled

    def set(self, enabled: Iterable[str]) -> None:
        """The cluster's set, from its primary (or this broker's own choice as a new cluster's first primary)."""
        enabled = frozenset(enabled)
        if enabled == self.enabled and self.known:
            return
        for name in sorted(enabled - self.enabled):
            log.info("feature %s enabled", name)
        self.enabled, self.known = enabled, True
        self._save()

    def describe(self, supported_by: dict[str, frozenset[str] | None]) -> list[dict[str, Any]]:
        """Each feature this build knows: enabled or not, and which members support it (None: not known now)."""
        return [{"name": f.name, "since": f.since, "description": f.description, "enabled": f.name in self.enabled,
                 "supported_by": {member: None if features is None else f.name in features
                                  for member, features in supported_by.items()}}
                for f in SUPPORTED.values()]

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({formats.MARKER: FORMAT, "enabled": sorted(self.enabled)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
