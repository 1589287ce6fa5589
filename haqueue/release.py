"""This build's release and replication protocols, and those a broker's status gives, as `haqueue --version`, the
metrics and the console show them (CHANGELOG.md, design/upgrades.md)."""
from __future__ import annotations

from typing import Any

from . import __version__
from .ha import protocol, versions

BUILD = versions.Build("haqueue", __version__, protocol.OLDEST_PROTOCOL, protocol.PROTOCOL, frozenset())
_UNANNOUNCED = versions.announced({}, "")  # an HA broker whose status names no protocols: release 0.1.0's


def version_line() -> str:
    return f"haqueue {BUILD.release} (replication protocol {BUILD.newest}; speaks {BUILD.protocols})"


def build_of(status: dict[str, Any]) -> versions.Build:
    """The release and replication protocols of the broker whose `READ broker` answer is `status`. A standalone
    broker replicates nothing and names none: it speaks what its build does, which is this one where it is asked
    of itself."""
    fallback = BUILD if status.get("role") == "standalone" else _UNANNOUNCED
    oldest, newest = status.get("protocols") or (fallback.oldest, fallback.newest)
    return versions.Build(str(status.get("name", "")), str(status.get("version") or fallback.release), int(oldest),
                          int(newest), frozenset())


def build_fields(status: dict[str, Any]) -> dict[str, Any]:
    """The console's `release` and `protocols` ([oldest, newest]) of the broker whose `READ broker` is `status`."""
    build = build_of(status)
    return {"release": build.release, "protocols": [build.oldest, build.newest]}
