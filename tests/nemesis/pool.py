"""At most one nemesis cluster alive at a time (two cores; namespaces shared with other suites).

`Pool.get(coordinator, sync, min_confirmations)` returns the running cluster if it is that one, else
destroys the current one and builds it; `Pool.healthy(...)` also heals it first (or rebuilds it). `close()` destroys whatever is left, also after a failure.
`unavailable(coordinator)` says why a coordinator cannot run here (root, namespaces, iptables, loop
devices, Pacemaker's or ZooKeeper's programs), for a clean skip.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pacemaker"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zookeeper"))

import disks  # noqa: E402
import netfilter  # noqa: E402
import zk_harness  # noqa: E402
from pcmk_cluster import missing_programs, namespaces_work  # noqa: E402


def unavailable(coordinator: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root: namespaces, iptables, loop mounts"
    why = namespaces_work() or netfilter.available() or disks.loop_available()
    if why:
        return why
    if coordinator == "pacemaker":
        missing = missing_programs()
        return f"missing {', '.join(missing)} (make setup installs Pacemaker)" if missing else None
    why = zk_harness.available()
    if why:
        return why
    try:
        import kazoo  # noqa: F401
    except ImportError:
        return "kazoo is not installed (pip install -e '.[zk]')"
    return None


def _make(coordinator: str, sync: str, min_confirmations: int | None) -> Any:
    if coordinator == "pacemaker":
        from pcmk_nemesis import NemesisPacemakerCluster, clean_leftovers
        clean_leftovers()
        return _built(NemesisPacemakerCluster(sync, min_confirmations), lambda c: c.wait_healthy(90))
    from zk_netns import ZkNetnsCluster
    return _built(ZkNetnsCluster(Path(tempfile.mkdtemp(prefix="zk-nemesis-")), sync, min_confirmations),
                  lambda c: None)


def _built(cluster: Any, ready: Callable[[Any], object]) -> Any:
    """The cluster created and `ready`; on any failure described, destroyed and its files gone."""
    try:
        cluster.create()
        ready(cluster)
    except BaseException:
        print(cluster.describe())
        cluster.destroy()
        cluster.remove_files()
        raise
    return cluster


class Pool:
    def __init__(self, keep_files: bool = False, log: Callable[[str], None] = print) -> None:
        self.key: tuple | None = None
        self.cluster: Any = None
        self.keep_files, self.log = keep_files, log

    def get(self, coordinator: str, sync: str, min_confirmations: int | None = None) -> Any:
        key = (coordinator, sync, min_confirmations)
        if key != self.key:
            self.close()
            self.log(f"nemesis: building a {coordinator} cluster, ha.sync {sync}"
                     + ("" if min_confirmations is None else f", ha.min_confirmations {min_confirmations}"))
            self.cluster, self.key = _make(*key), key
        return self.cluster

    def healthy(self, coordinator: str, sync: str, min_confirmations: int | None = None) -> Any:
        """`get`, then healed and healthy (a failed test may have left a fault); rebuilt if it cannot be."""
        cluster = self.get(coordinator, sync, min_confirmations)
        try:
            cluster.heal_and_wait(90)
        except AssertionError as e:
            self.log(f"nemesis: the cluster did not heal ({e}); building it again")
            self.close()
            cluster = self.get(coordinator, sync, min_confirmations)
        return cluster

    def close(self) -> None:
        if self.cluster is None:
            return
        cluster, self.cluster, self.key = self.cluster, None, None
        cluster.destroy()
        if self.keep_files:
            self.log(f"nemesis: cluster files kept in {getattr(cluster, 'base', None) or cluster.directory}")
        else:
            cluster.remove_files()
