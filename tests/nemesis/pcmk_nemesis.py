"""The Pacemaker netns cluster (tests/pacemaker/pcmk_cluster.py) made a nemesis target.

`NemesisPacemakerCluster` is a `PacemakerCluster` (same interface, same layout and names) whose brokers
run a given `ha.sync` and `ha.min_confirmations`, whose node stores are each a small ext4 of their own
(disks.py: disk full, slow disk), and whose teardown also heals partitions and lifts throttles. It adds
what the nemeses and the runner need (`primary`, `backups`, `kill_broker`, `revive`, `depth`, ...).
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pacemaker"))

import disks  # noqa: E402
import netfilter  # noqa: E402
from ledger_clients import VipLoad  # noqa: E402
from pcmk_cluster import BACKUP_TIMEOUT, PREFIX, VIP_ADDRESS, Node, PacemakerCluster  # noqa: E402

STORE_MB = 256


class NemesisPacemakerCluster(PacemakerCluster):
    coordinator = "pacemaker"
    backup_timeout = BACKUP_TIMEOUT

    def __init__(self, sync: str = "all", min_confirmations: int | None = None, size: int = 3) -> None:
        super().__init__(size)
        self.sync, self.min_confirmations = sync, min_confirmations
        self.mounted: list[Path] = []

    # ---- building (hooks of PacemakerCluster) ------------------------------------------------
    def ha_section(self, brokers: list[str]) -> dict:
        ha = {**super().ha_section(brokers), "sync": self.sync}
        if self.min_confirmations is not None:
            ha["min_confirmations"] = self.min_confirmations
        return ha

    def _prepare(self, node: Node, seed: Path) -> None:
        super()._prepare(node, seed)
        store = self.store(node)  # the host side of the node's /var/lib/haqueue, before the node binds it
        disks.mount_store(node.root / "store.img", store, STORE_MB)
        self.mounted.append(store)

    def destroy(self) -> None:
        for node in self.nodes:
            netfilter.heal(node.ns)
        disks.unthrottle_all()
        for node in self.nodes:
            disks.unfill(self.store(node))
        super().destroy()
        for mount in self.mounted:
            disks.unmount(mount)
        self.mounted.clear()

    # ---- the nemesis target ----------------------------------------------------------------------
    def store(self, node: Node) -> Path:
        return node.dir("lib-haqueue")

    def primary(self) -> Node | None:
        return self.primary_node()

    def backups(self) -> list[Node]:
        p = self.primary()
        return [n for n in self.nodes if n is not p]

    def broker_pid_of(self, node: Node) -> int | None:
        pids = self.broker_pids_in(node)
        return pids[0] if pids else None

    def kill_broker(self, node: Node) -> None:
        for pid in self.broker_pids_in(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pause_broker(self, node: Node) -> None:
        """SIGSTOP; `heal_and_wait` (and teardown) SIGCONT it."""
        pid = self.broker_pid_of(node)
        if pid is not None:
            self.sigstop(pid)

    def heal_processes(self) -> None:
        for pid in list(self.stopped_pids):
            self.sigcont(pid)

    def revive(self) -> None:
        """Pacemaker restarts killed brokers itself; its failure records are cleared by `heal_and_wait`."""

    def heal_and_wait(self, timeout: float = 120.0) -> Node:
        """Heal every partition, then back to healthy (failure records cleaned, as between tests)."""
        for node in self.nodes:
            netfilter.heal(node.ns)
        disks.unthrottle_all()
        for node in self.nodes:
            disks.unfill(self.store(node))
        self.heal_processes()
        try:
            return self.restore(timeout / 2)
        except AssertionError:
            # A recovery (after kill-all) may record failed actions after restore's cleanup ("cannot promote:
            # the broker is not running" while the brokers came back): a second cleanup clears them.
            return self.restore(timeout / 2)

    def depth(self, queue: str) -> int | None:
        p = self.primary()
        return self.queue_depth(p, queue) if p is not None else None

    def load(self, queue: str, ledger: Path) -> VipLoad:
        return VipLoad(VIP_ADDRESS, queue, ledger=ledger)

    def broker_logs(self) -> dict[str, Path]:
        return {n.name: n.broker_log for n in self.nodes}


def clean_leftovers() -> None:
    """An earlier run's loop mounts and throttles (its namespaces: pcmk_cluster.clean_leftovers)."""
    disks.unthrottle_all()
    for mount in disks.leftover_mounts(f"/{PREFIX}-"):
        disks.unmount(Path(mount))
