"""The three-node Pacemaker cluster of pcmk_cluster.py running a sharded haqueue from ONE cluster file,
/etc/haqueue/cluster.yaml on every node: 2 shards of 2 replicas placed by haqueue's own code (shard 0 on node1,
node2; shard 1 on node2, node3; the first the preferred primary), each replica the shard's process
`haqueue broker --config cluster.yaml --node <node> --shard <i>` run by the agent (its `shard` parameter): clients
on 0.0.0.0:5672 of every process (SO_REUSEPORT), peers on the node's address :5690+i, shard i's direct address
its VIP 10.213.47.110+i, port 5680+i. The resources are made by the project's own `packaging/pcs-shard-setup.sh`
from that file: a clone and a VIP per shard, a VIP per node (10.213.47.101..103)."""
from __future__ import annotations

import json
import os

import yaml

from harness import wait_for
from pcmk_cluster import BINARY, HA_USER, PING_TIMEOUT, POLL_INTERVAL, REPO, SUBNET, Node, PacemakerCluster, run

from haqueue.admin import AdminClient, AdminError

SHARDS, REPLICAS = 2, 2
CLIENT_PORT, SHARD_PORT, SHARD_PEER_PORT = 5672, 5680, 5690  # the last two + the shard's index
CLUSTER_FILE = "/etc/haqueue/cluster.yaml"  # on every node
# A relay waits for the shard's new primary that long before detaching its clients' links (shard.relay_timeout,
# design/sharding.md): the default. At 15 s, above a failover here when quiet (about 6 s), the relay detached a
# consumer's link under load 14: the new primary was promoted 10.4 s after the kill, and its VIP came later still.
RELAY_TIMEOUT = 60.0
# ha.backup_timeout: with the harness's 3 s, one run's relayed send waited 20 s at the failback
BACKUP_TIMEOUT = 15.0


def node_vip(node: Node) -> str:
    return f"{SUBNET}.{100 + node.index}"


def shard_vip(shard: int) -> str:
    return f"{SUBNET}.{110 + shard}"


class ShardedPacemakerCluster(PacemakerCluster):
    def __init__(self) -> None:
        super().__init__()
        self.cluster_file = self.base / "cluster.yaml"
        self.cluster_file.write_text(yaml.safe_dump({
            "shards": SHARDS, "replicas": REPLICAS,
            "nodes": {n.name: {"address": n.ip} for n in self.nodes},
            "client_port": CLIENT_PORT, "peer_base": SHARD_PEER_PORT,
            "pacemaker": {"node_vips": {n.name: node_vip(n) for n in self.nodes},
                          "shard_vips": [shard_vip(i) for i in range(SHARDS)], "shard_port": SHARD_PORT},
            "data_dir": "/var/lib/haqueue",
            "shard": {"relay_timeout": RELAY_TIMEOUT},
            # min_confirmations 1: a shard of two replicas goes on after a failover (the floor's opt-out)
            "ha": {**self.ha_credentials(), "backup_timeout": BACKUP_TIMEOUT, "min_confirmations": 1},
        }, sort_keys=False))
        self.cluster_file.chmod(0o600)
        placement = run([str(BINARY), "place", "--config", str(self.cluster_file), "--format", "json"]).stdout
        self.replicas = {s["shard"]: s["replicas"] for s in json.loads(placement)["shards"]}

    @staticmethod
    def shard_peer(node: Node, shard: int) -> str:
        return f"{node.ip}:{SHARD_PEER_PORT + shard}"

    def write_broker_configs(self, node: Node) -> None:
        """The one cluster file, the same on every node."""
        (node.dir("etc-haqueue") / "cluster.yaml").write_bytes(self.cluster_file.read_bytes())
        (node.dir("etc-haqueue") / "cluster.yaml").chmod(0o600)

    def setup_resources(self) -> None:
        env = {**os.environ, "CIDR_NETMASK": "24", "NIC": "eth0", "BINARY": str(BINARY),
               "PING_TIMEOUT": str(PING_TIMEOUT)}
        self.on(self.nodes[0], ["sh", str(REPO / "packaging" / "pcs-shard-setup.sh"), CLUSTER_FILE],
                timeout=240, env=env)

    def roles(self, resource: str) -> dict[str, str]:
        """Node -> role of each active, not failed instance of the resource (a clone's or a VIP)."""
        found: dict[str, str] = {}
        for r in self.status().root.iter("resource"):
            if r.get("id") == resource and r.get("active") == "true" and r.get("failed") != "true":
                found.update({n.get("name"): r.get("role") for n in r.findall("node")})
        return found

    @staticmethod
    def shard_pid(node: Node, shard: int) -> int:
        """The shard's broker on the node, from the agent's pid file."""
        return int((node.dir("run") / "resource-agents" / f"haqueue-haqueue-s{shard}.pid").read_text().strip())

    def shard_admin(self, node: Node, shard: int) -> AdminClient:
        """The admin client of the shard's process on the node, at its peer address."""
        return AdminClient(self.shard_peer(node, shard), 3.0, HA_USER, self.password)

    def shard_broker(self, node: Node, shard: int) -> dict | None:
        try:
            with self.shard_admin(node, shard) as client:
                code, _, body = client.request("READ", "ha")
            return body if code < 400 else None
        except AdminError:
            return None

    def preferred_primaries(self) -> tuple[bool, str]:
        """Every shard promoted on its preferred node, whose broker is its primary with the others ready."""
        for shard, replicas in self.replicas.items():
            roles = self.roles(f"haqueue-s{shard}")
            if roles != {replicas[0]: "Promoted", **{n: "Unpromoted" for n in replicas[1:]}}:
                return False, f"shard {shard}: {roles}"
            vip = self.roles(f"haqueue-s{shard}-vip")
            if vip != {replicas[0]: "Started"}:
                return False, f"shard {shard}'s VIP: {vip}"
            primary = self.shard_broker(self.node(replicas[0]), shard)
            if not primary or (primary.get("role"), primary.get("state")) != ("primary", "active"):
                return False, f"shard {shard} on {replicas[0]}: {primary}"
            for name in replicas[1:]:
                backup = self.shard_broker(self.node(name), shard)
                if not backup or (backup.get("role"), backup.get("state")) != ("backup", "ready"):
                    return False, f"shard {shard} on {name}: {backup}"
        return True, "every shard on its preferred primary"

    def wait_preferred_primaries(self, timeout: float = 120.0) -> None:
        last = [""]

        def check() -> bool:
            ok, last[0] = self.preferred_primaries()
            return ok
        try:
            wait_for(check, timeout, interval=POLL_INTERVAL * 5, message="every shard on its preferred primary")
        except AssertionError as e:
            raise AssertionError(f"{e}: {last[0]}\n{self.describe()}") from None
