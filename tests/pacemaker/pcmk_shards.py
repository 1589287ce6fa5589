"""The three-node Pacemaker cluster of pcmk_cluster.py running a sharded haqueue: 2 shards of 2 replicas
placed by `haqueue place` (shard 0 on node1, node2; shard 1 on node2, node3; the first the preferred
primary), each replica a broker process with its own config /etc/haqueue/shard-<i>.yaml (clients on
0.0.0.0:5680+i, peers on the node's address :5690+i), the resources made by the project's own
`packaging/pcs-shard-setup.sh` (a clone per shard, a VIP per node: 10.213.47.101..103)."""
from __future__ import annotations

import json
import os

import threading

from proton.utils import BlockingConnection

from harness import wait_for
from ha_harness import connect
from pcmk_clients import Load
from pcmk_cluster import BINARY, HA_USER, PING_TIMEOUT, POLL_INTERVAL, REPO, SUBNET, Node, PacemakerCluster, run

from haqueue.admin import AdminClient, AdminError

SHARDS, REPLICAS = 2, 2
SHARD_CLIENT_PORT, SHARD_PEER_PORT = 5680, 5690  # + the shard's index


def node_vip(node: Node) -> str:
    return f"{SUBNET}.{100 + node.index}"


class ShardedPacemakerCluster(PacemakerCluster):
    def __init__(self) -> None:
        super().__init__()
        self.placement = run([str(BINARY), "place", "--nodes", ",".join(n.name for n in self.nodes),
                              "--shards", str(SHARDS), "--replicas", str(REPLICAS), "--format", "json"]).stdout
        self.replicas = {s["shard"]: s["replicas"] for s in json.loads(self.placement)["shards"]}

    @staticmethod
    def shard_peer(node: Node, shard: int) -> str:
        return f"{node.ip}:{SHARD_PEER_PORT + shard}"

    def write_broker_configs(self, node: Node) -> None:
        """A config for each shard placed on the node, none for the others (a probe there finds none)."""
        for shard, replicas in self.replicas.items():
            if node.name in replicas:
                self.write_broker_config(node, f"shard-{shard}.yaml", {
                    "name": f"{node.name}.s{shard}",
                    "listen": [f"0.0.0.0:{SHARD_CLIENT_PORT + shard}", self.shard_peer(node, shard)],
                    "data_dir": ".",  # the agent's data_dir, /var/lib/haqueue/shard-<i>
                    "ha": self.ha_section([self.shard_peer(self.node(n), shard) for n in replicas]),
                })

    def setup_resources(self) -> None:
        placement = self.base / "placement.json"
        placement.write_text(self.placement)
        env = {**os.environ, "VIPS": ",".join(f"{n.name}={node_vip(n)}" for n in self.nodes), "CIDR_NETMASK": "24",
               "NIC": "eth0", "BINARY": str(BINARY), "PING_TIMEOUT": str(PING_TIMEOUT)}
        self.on(self.nodes[0], ["sh", str(REPO / "packaging" / "pcs-shard-setup.sh"), str(placement)],
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

    def shard_broker(self, node: Node, shard: int) -> dict | None:
        try:
            with AdminClient(self.shard_peer(node, shard), 3.0, HA_USER, self.password) as client:
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


class ShardLoad(Load):
    """The Pacemaker tests' reconnecting producer and consumer (pcmk_clients.py) on one shard's queue,
    with no VIP in front of the shard: each connection goes to the next of the shard's replicas' client
    addresses in turn (the backups refuse clients), as a failover-capable client's URL list does."""

    def __init__(self, addresses: list[str], queue: str) -> None:
        super().__init__(addresses[0], queue)
        self.addresses = addresses
        self.turns = {"producer": 0, "consumer": 0}

    def _connect(self, stop: threading.Event) -> BlockingConnection:
        name = threading.current_thread().name  # "producer" or "consumer": each its own turn
        address = self.addresses[self.turns[name] % len(self.addresses)]
        self.turns[name] += 1
        return connect(address, timeout=self.connect_timeout)
