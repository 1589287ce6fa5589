"""Helpers for the shard tests: a sharded cluster of real broker processes on loopback.

`ShardCluster`  N simulated nodes on 127.0.0.1, 127.0.0.2, ... (all loopback), one cluster config file,
                and one `ShardProcess` per (node, shard) the placement gives, run as
                `haqueue broker --config CLUSTER --node N --shard I`. Each node's processes share its client
                port (reuse_port); shard i's direct address is shard_public's port + i, bound by its primary.
                It is an `HaCluster`, so the HA tests' admin calls, waits and log tails work on its processes.
"""
from __future__ import annotations

import secrets
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ha"))

from harness import BrokerProcess, can_connect, free_port, split_address, wait_for  # noqa: E402
from ha_harness import HA_USER, OPS_USER, PAIR_GOES_ON, HaCluster  # noqa: E402

from haqueue.shard.ownership import shard_of_name  # noqa: E402
from haqueue.shard.placement import place  # noqa: E402
from haqueue.shard.topology import Topology  # noqa: E402


class ShardProcess(BrokerProcess):
    """One shard's replica on one node; `address` is its peer listener (the admin calls' way in)."""

    def __init__(self, directory: Path, cluster: dict[str, Any], node: str, shard: int, peer: str,
                 client: str) -> None:
        self.node, self.shard = node, shard
        self._listen = [peer, client]
        super().__init__(directory, cluster, name=f"{node}.s{shard}",
                         extra_args=["--node", node, "--shard", str(shard)])

    def _resolve(self, config: dict) -> dict:
        return config  # the cluster's file as it is: the process derives its own config

    @property
    def addresses(self) -> list[str]:
        return self._listen


def no_copy(row: dict | None) -> bool:
    """A queue of another shard, as a non-owner lists it (`queues` row): absent, or at most the forwarding queue it
    takes from the owner's wiring (design/sharding.md), nothing enqueued through it. Whether that take ran before
    a test looks is timing."""
    return row is None or (row["args"].get("x-shard-forward") == 1 and row["enqueued"] == 0)


def owned_by(shard: int, prefix: str, shards: int = 2) -> str:
    """A queue name (prefix-N) whose hash puts it in `shard`."""
    return next(name for name in (f"{prefix}-{i}" for i in range(1000)) if shard_of_name(name, shards) == shard)


def _free_run(hosts: list[str], count: int) -> int:
    """A port p such that p .. p + count - 1 are free on every host a moment ago."""
    while True:
        base = free_port()
        if base + count > 65535:
            continue
        try:
            for host in hosts:
                for port in range(base, base + count):
                    with socket.socket() as s:
                        s.bind((host, port))
        except OSError:
            continue
        return base


class ShardCluster(HaCluster):
    def __init__(self, directory: Path, size: int = 2, shards: int = 2, replicas: int = 2,
                 backup_timeout: float = 2.0, relay_timeout: float = 2.0,
                 extra: dict[str, Any] | None = None) -> None:
        """`extra`: more keys of the cluster file (every process's), e.g. an audit section; its `ha` and `shard`
        keys are added to the harness's."""
        self.directory = Path(directory)
        self.password = secrets.token_hex(8)
        self.tls = None
        self.stopped: set[str] = set()
        self.hosts = {f"n{k + 1}": f"127.0.0.{k + 1}" for k in range(size)}
        hosts = list(self.hosts.values())
        self.client_port = _free_run(hosts, 1)
        peer_base = _free_run(hosts, shards)
        public_base = _free_run(["127.0.0.1"], shards)
        self.publics = [f"127.0.0.1:{public_base + i}" for i in range(shards)]
        self.public = self.publics[0]
        self.placement = place(Topology.of(list(self.hosts)), shards, replicas).shards
        ops = {"password": self.password, "allow": {"send": ["*"], "receive": ["*"], "manage": ["*"], "admin": True}}
        self.config: dict[str, Any] = {
            "shards": shards, "replicas": replicas, "client_port": self.client_port, "peer_base": peer_base,
            "shard_public": self.publics[0],
            "nodes": {node: {"address": host, "data_dir": str(self.directory / node / "data")}
                      for node, host in self.hosts.items()},
            "users": {OPS_USER: ops},
            **(extra or {}),
            "ha": {"username": HA_USER, "password": self.password, "backup_timeout": backup_timeout,
                   **(PAIR_GOES_ON if replicas == 2 else {}),  # a shard of two goes on after a failover
                   **(extra or {}).get("ha", {})},
            "shard": {"relay_timeout": relay_timeout, **(extra or {}).get("shard", {})}}
        self.brokers: list[ShardProcess] = []
        for shard, nodes in enumerate(self.placement):
            for node in nodes:
                host = self.hosts[node]
                self.brokers.append(ShardProcess(self.directory / node / f"s{shard}", self.config, node, shard,
                                                 f"{host}:{peer_base + shard}", f"{host}:{self.client_port}"))

    def process(self, node: str, shard: int) -> ShardProcess:
        return next(b for b in self.brokers if b.node == node and b.shard == shard)

    def shard_processes(self, shard: int) -> list[ShardProcess]:
        """Shard `shard`'s processes, its preferred primary first."""
        return [self.process(node, shard) for node in self.placement[shard]]

    def client_address(self, node: str) -> str:
        return f"{self.hosts[node]}:{self.client_port}"

    def promote(self, b: BrokerProcess, force: bool = False) -> dict[str, Any]:
        answer = self.request(b, "PROMOTE", "ha", body={"force": force}, user=HA_USER)
        public = self.publics[b.shard]  # type: ignore[attr-defined]
        wait_for(lambda: can_connect(*split_address(public)), 10, message=f"shard public address {public}")
        return answer

    def start_shards(self, timeout: float = 20.0) -> None:
        """Start every process; promote each shard's preferred primary; wait for its backups to be ready."""
        self.start()
        for shard in range(len(self.placement)):
            primary, *backups = self.shard_processes(shard)
            self.promote(primary)
            for b in backups:
                self.wait_ready(b, timeout)
            self.wait_backups_ready(primary, [b.name for b in backups], timeout)
            self.wait_state(primary, "primary", "active", timeout)
