"""The nemeses: each one breaks something for `hold` seconds, then undoes its own damage.

A nemesis is `begin(cluster, rng) -> description`, a hold (a plain wait: the fault's duration, not a
synchronisation), then `end(cluster)`; the runner then heals everything and waits for a healthy
cluster. `cluster` is a NemesisPacemakerCluster or a ZkNetnsCluster: nodes with `ns` and `ip`,
`primary()`, `backups()`, `kill_broker`, `pause_broker`, `broker_pid_of`, `store`, `revive`.
Random choices (which backup, the flap's rhythm) come from the runner's seeded `rng` only.
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import disks
import netfilter

SLOW_DISK_IOPS = 5  # each journal sync waits ~0.2 s


def _others(cluster: Any, node: Any) -> list[str]:
    return [n.ip for n in cluster.nodes if n is not node]


def _need_primary(cluster: Any) -> Any:
    p = cluster.primary()
    if p is None:
        raise AssertionError("no primary to aim the nemesis at")
    return p


@dataclass
class Nemesis:
    name: str
    hold: float
    _state: dict = field(default_factory=dict, repr=False)

    def begin(self, cluster: Any, rng: random.Random) -> str:
        raise NotImplementedError

    def end(self, cluster: Any) -> None:
        """Undo this nemesis's own fault (the runner heals everything afterwards anyway)."""


class Partition(Nemesis):
    """Cut one node from its peers (not from the clients). `pick` chooses it."""

    def __init__(self, name: str, hold: float, pick: Callable[[Any, random.Random], Any]) -> None:
        super().__init__(name, hold)
        self.pick = pick

    def begin(self, cluster: Any, rng: random.Random) -> str:
        node = self.pick(cluster, rng)
        netfilter.cut(node.ns, _others(cluster, node))
        self._state["node"] = node
        return f"{node.name} cut from {', '.join(_others(cluster, node))}"

    def end(self, cluster: Any) -> None:
        netfilter.heal(self._state["node"].ns)


class Flap(Nemesis):
    """The primary's links to its peers go down and up, each phase 0.5-3 s (from the seed)."""

    def begin(self, cluster: Any, rng: random.Random) -> str:
        node = _need_primary(cluster)
        stop = threading.Event()
        phases = [rng.uniform(0.5, 3.0) for _ in range(64)]

        def flap() -> None:
            for i, phase in enumerate(phases):
                if stop.is_set():
                    break
                (netfilter.cut(node.ns, _others(cluster, node)) if i % 2 == 0 else netfilter.heal(node.ns))
                stop.wait(phase)
            netfilter.heal(node.ns)
        thread = threading.Thread(target=flap, daemon=True, name="flap")
        thread.start()
        self._state.update(node=node, stop=stop, thread=thread)
        return f"{node.name}'s links flapping ({', '.join(f'{p:.1f}' for p in phases[:6])} s ...)"

    def end(self, cluster: Any) -> None:
        self._state["stop"].set()
        self._state["thread"].join(10)
        netfilter.heal(self._state["node"].ns)


class Kill(Nemesis):
    """SIGKILL brokers (`pick` gives the list); ZooKeeper's harness restarts them at heal, Pacemaker itself."""

    def __init__(self, name: str, hold: float, pick: Callable[[Any, random.Random], list]) -> None:
        super().__init__(name, hold)
        self.pick = pick

    def begin(self, cluster: Any, rng: random.Random) -> str:
        nodes = self.pick(cluster, rng)
        for node in nodes:
            cluster.kill_broker(node)
        return f"kill -9 of the broker on {', '.join(n.name for n in nodes)}"

    def end(self, cluster: Any) -> None:
        cluster.revive()


class Pause(Nemesis):
    """SIGSTOP the primary for `hold` (longer than backup_timeout), then SIGCONT."""

    def begin(self, cluster: Any, rng: random.Random) -> str:
        node = _need_primary(cluster)
        cluster.pause_broker(node)
        self._state["node"] = node
        return f"SIGSTOP of {node.name}'s broker"

    def end(self, cluster: Any) -> None:
        cluster.heal_processes()


class SlowDisk(Nemesis):
    """The primary's store device limited to SLOW_DISK_IOPS writes a second for this broker process."""

    def begin(self, cluster: Any, rng: random.Random) -> str:
        node = _need_primary(cluster)
        pid = cluster.broker_pid_of(node)
        disks.throttle(node.name, pid, disks.device_of(cluster.store(node)), SLOW_DISK_IOPS)
        self._state["node"] = node
        return f"{node.name}'s store throttled to {SLOW_DISK_IOPS} write IOPS (pid {pid})"

    def end(self, cluster: Any) -> None:
        disks.unthrottle(self._state["node"].name)


class DiskFull(Nemesis):
    """The primary's store file system filled to the last block."""

    def begin(self, cluster: Any, rng: random.Random) -> str:
        node = _need_primary(cluster)
        written = disks.fill(cluster.store(node))
        self._state["node"] = node
        return f"{node.name}'s store filled ({written >> 20} MB)"

    def end(self, cluster: Any) -> None:
        disks.unfill(cluster.store(self._state["node"]))


def _primary(cluster: Any, rng: random.Random) -> Any:
    return _need_primary(cluster)


def _a_backup(cluster: Any, rng: random.Random) -> Any:
    return rng.choice(cluster.backups())


def _any_node(cluster: Any, rng: random.Random) -> Any:
    return rng.choice(cluster.nodes)


def catalogue(backup_timeout: float, hold: float = 12.0) -> dict[str, Callable[[], Nemesis]]:
    """Every nemesis by name, made fresh per use (they keep state between begin and end)."""
    return {
        "partition-primary": lambda: Partition("partition-primary", hold, _primary),
        "partition-backup": lambda: Partition("partition-backup", hold, _a_backup),
        # 1 node against 2, the node chosen at random (primary or not); the clients, in the root
        # namespace, reach both sides
        "partition-minority": lambda: Partition("partition-minority", hold, _any_node),
        "flap": lambda: Flap("flap", hold),
        "kill-primary": lambda: Kill("kill-primary", 2 * backup_timeout, lambda c, r: [_need_primary(c)]),
        "kill-backup": lambda: Kill("kill-backup", 2 * backup_timeout, lambda c, r: [_a_backup(c, r)]),
        "kill-all": lambda: Kill("kill-all", 1.0, lambda c, r: list(c.nodes)),
        "pause-primary": lambda: Pause("pause-primary", 3 * backup_timeout),
        "slow-disk": lambda: SlowDisk("slow-disk", hold),  # needs cgroup v1 blkio (disks.blkio_available)
        "disk-full": lambda: DiskFull("disk-full", hold),
    }


def plan(names: list[str], backup_timeout: float, hold: float = 12.0) -> list[Nemesis]:
    made = catalogue(backup_timeout, hold)
    return [made[n]() for n in names]


def mixed(rng: random.Random, count: int, backup_timeout: float, hold: float = 12.0,
          exclude: tuple[str, ...] = ()) -> list[Nemesis]:
    """`count` nemeses drawn from the catalogue with `rng` (the seed replays the same plan)."""
    names = [n for n in catalogue(backup_timeout) if n not in exclude]
    return plan([rng.choice(names) for _ in range(count)], backup_timeout, hold)
