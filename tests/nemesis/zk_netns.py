"""Brokers and a 3-server ZooKeeper ensemble in network namespaces, so a partition cuts ZooKeeper too.

Layout (names start with `hqzk`, addresses in 10.213.48.0/24, apart from the Pacemaker harness's
`hqpm`/10.213.47.0/24 so both can exist):

    root namespace   bridge hqzk-br 10.213.48.1/24: the clients, admin calls and this harness
    hqzk1..hqzk3     network namespaces, veth eth0 10.213.48.11..13; each runs one ZooKeeper server
                     (client port 2181, quorum 2888/3888 on the node's address, `tickTime=500`) and
                     one broker (clients and peers on the node's address :5672, `coordinator:
                     zookeeper` with the three servers as `hosts`, `session_timeout` 3 s)

A broker's data dir is a small ext4 of its own (disks.py), mounted on the host (no mount namespace is
needed: the processes only need their own network). Servers and brokers are started with
`ip netns exec NS ...` (which execs, so the process is the server or broker itself), each in its own
session. `destroy()` kills every process in the namespaces, deletes them, the bridge and the mounts.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pacemaker"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zookeeper"))

import disks  # noqa: E402
import netfilter  # noqa: E402
import zk_harness  # noqa: E402
from ledger_clients import RotatingLoad  # noqa: E402
from harness import BrokerProcess, can_connect, split_address, wait_for  # noqa: E402
from pcmk_cluster import _kill_namespace, bridge_namespaces, run  # noqa: E402
from zk_cluster import ZkCluster  # noqa: E402

PREFIX = "hqzk"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.213.48"
HOST_ADDRESS = f"{SUBNET}.1"
CLIENT_PORT = 5672
ZK_PORT, ZK_PEER_PORT, ZK_ELECTION_PORT = 2181, 2888, 3888
SESSION_TIMEOUT = 3.0
BACKUP_TIMEOUT = 3.0
STORE_MB = 256


class NsNode:
    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"node{index}"
        self.ns = f"{PREFIX}{index}"
        self.veth = f"{PREFIX}{index}-h"
        self.ip = f"{SUBNET}.{10 + index}"

    def __repr__(self) -> str:
        return self.name


class NsServer(zk_harness.Server):
    """A ZooKeeper server inside a node's namespace, on the node's address."""

    def __init__(self, directory: Path, node: NsNode) -> None:
        super().__init__(directory, node.index)
        self.node = node
        self.client_port, self.peer_port, self.election_port = ZK_PORT, ZK_PEER_PORT, ZK_ELECTION_PORT

    @property
    def address(self) -> str:
        return f"{self.node.ip}:{ZK_PORT}"

    def mode(self) -> str | None:
        try:
            with socket.create_connection((self.node.ip, ZK_PORT), timeout=1.0) as s:
                s.sendall(b"srvr")
                answer = b"".join(iter(lambda: s.recv(4096), b"")).decode(errors="replace")
        except OSError:
            return None
        return next((line[6:].strip() for line in answer.splitlines() if line.startswith("Mode: ")), None)

    def start(self, servers: list[zk_harness.Server]) -> None:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{self.myid}\n")
        config = [f"tickTime={zk_harness.TICK_MS}", "initLimit=10", "syncLimit=5", f"dataDir={data}",
                  f"clientPort={ZK_PORT}", f"clientPortAddress={self.node.ip}", "admin.enableServer=false",
                  "4lw.commands.whitelist=ruok,srvr,stat,mntr", "maxClientCnxns=0",
                  *(f"server.{s.myid}={s.node.ip}:{ZK_PEER_PORT}:{ZK_ELECTION_PORT}" for s in servers)]
        cfg = self.directory / "zoo.cfg"
        cfg.write_text("\n".join(config) + "\n")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.node.ns, *zk_harness.JAVA, "-cp", ":".join(zk_harness.JARS),
                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


class NsEnsemble(zk_harness.Ensemble):
    def __init__(self, directory: Path, nodes: list[NsNode]) -> None:
        self.servers = [NsServer(directory / f"zk{n.index}", n) for n in nodes]


class NsBroker(BrokerProcess):
    """A broker run inside its node's network namespace (`ns`, set by the cluster)."""

    ns: str
    ip: str

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *super().command()]

    def wait_listening(self, timeout: float = 15.0) -> None:
        """Until its address accepts connections (harness.listening_ports reads the root namespace's
        sockets, so the base class's check that the port is this process's cannot apply here)."""
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            return can_connect(*split_address(self.address), timeout=0.2)
        wait_for(up, timeout, message=f"broker {self.name} listening on {self.address}")


class ZkNetnsCluster(ZkCluster):
    """A `ZkCluster` (tests/zookeeper/zk_cluster.py) whose brokers and ensemble live in namespaces."""

    coordinator = "zookeeper"
    backup_timeout = BACKUP_TIMEOUT
    state_timeout = 30.0

    def __init__(self, directory: Path, sync: str = "all", min_confirmations: int | None = None,
                 size: int = 3) -> None:
        self.ns_nodes = [NsNode(i) for i in range(1, size + 1)]
        self.ensemble = NsEnsemble(Path(directory) / "zookeeper", self.ns_nodes)
        super().__init__(Path(directory), self.ensemble.hosts, size, SESSION_TIMEOUT, path="/haqueue/nemesis")
        self.sync, self.min_confirmations = sync, min_confirmations
        self.mounted: list[Path] = []
        peers = [f"{n.ip}:{CLIENT_PORT}" for n in self.ns_nodes]
        for b, node in zip(self.brokers, self.ns_nodes):
            b.ns, b.ip = node.ns, node.ip  # what the nemeses address a node by, as PacemakerCluster's Node
            b.config["name"] = b.name = node.name
            b.config["listen"] = [peers[node.index - 1]]
            b.config["data_dir"] = str(b.directory / "store")
            ha = b.config["ha"]
            ha.update(brokers=peers, backup_timeout=BACKUP_TIMEOUT, sync=sync)
            if min_confirmations is not None:
                ha["min_confirmations"] = min_confirmations
            b.__class__ = NsBroker

    @property
    def nodes(self) -> list[BrokerProcess]:
        return self.brokers

    # ---- building and tearing down ---------------------------------------------------------------
    def create(self) -> None:
        clean_leftovers()
        bridge_namespaces(BRIDGE, HOST_ADDRESS, self.ns_nodes)
        for b in self.brokers:
            disks.mount_store(b.directory / "store.img", self.store(b), STORE_MB)
            self.mounted.append(self.store(b))
        self.ensemble.start()
        self.start()
        self.wait_healthy(60)

    def destroy(self) -> None:
        for n in self.ns_nodes:
            netfilter.heal(n.ns)
        disks.unthrottle_all()
        self.shutdown()
        self.ensemble.stop()
        for n in self.ns_nodes:
            _kill_namespace(n.ns)
        _delete_links()
        for mount in self.mounted:
            disks.unmount(mount)
        self.mounted.clear()

    def remove_files(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    # ---- the nemesis target ------------------------------------------------------------------------
    def store(self, b: BrokerProcess) -> Path:
        return b.directory / "store"

    def primary(self) -> BrokerProcess | None:
        found = self.primaries()
        return found[0] if len(found) == 1 else None

    def backups(self) -> list[BrokerProcess]:
        p = self.primary()
        return [b for b in self.brokers if b is not p]

    def broker_pid_of(self, b: BrokerProcess) -> int | None:
        return b.pid if b.running else None

    def kill_broker(self, b: BrokerProcess) -> None:
        self.kill(b)

    def pause_broker(self, b: BrokerProcess) -> None:
        """SIGSTOP; `heal_and_wait` (and teardown) SIGCONT it."""
        self.sigstop(b)

    def heal_processes(self) -> None:
        for b in self.brokers:
            if b.name in self.stopped:
                self.sigcont(b)

    def revive(self) -> None:
        """Start again every broker that is not running (killed by a nemesis)."""
        for b in self.brokers:
            if not b.running:
                b.start()

    def healthy(self) -> tuple[bool, str]:
        statuses = {b.name: self.try_status(b) for b in self.brokers}
        primaries = [n for n, s in statuses.items() if s and s["role"] == "primary"]
        if len(primaries) != 1:
            return False, f"primaries: {primaries}"
        if statuses[primaries[0]]["state"] != "active":
            return False, f"{primaries[0]} is {statuses[primaries[0]]['state']}"
        for name, s in statuses.items():
            if name != primaries[0] and not (s and s["role"] == "backup" and s["state"] == "ready"
                                             and s.get("primary")):
                return False, f"{name}: {s and {k: s.get(k) for k in ('role', 'state', 'primary')}}"
        return True, f"primary {primaries[0]}"

    def wait_healthy(self, timeout: float = 60.0) -> BrokerProcess:
        last = [""]

        def check() -> bool:
            ok, last[0] = self.healthy()
            return ok
        try:
            wait_for(check, timeout, interval=0.3, message="a healthy ZooKeeper cluster")
        except AssertionError as e:
            raise AssertionError(f"{e}: {last[0]}\n{self.ensemble.modes()}") from None
        return self.primary()

    def heal_and_wait(self, timeout: float = 120.0) -> BrokerProcess:
        for n in self.ns_nodes:
            netfilter.heal(n.ns)
        disks.unthrottle_all()
        self.heal_processes()
        for b in self.brokers:
            disks.unfill(self.store(b))
        self.revive()
        return self.wait_healthy(timeout)

    def depth(self, queue: str) -> int | None:
        p = self.primary()
        try:
            return self.depth_on(p, queue) if p is not None else None
        except Exception:  # noqa: BLE001 - a broker between roles does not answer
            return None

    def depth_on(self, b: BrokerProcess, queue: str) -> int | None:
        return ZkCluster.depth(self, b, queue)

    def load(self, queue: str, ledger: Path) -> RotatingLoad:
        return RotatingLoad(self.addresses, queue, ledger)

    def broker_logs(self) -> dict[str, Path]:
        return {b.name: b.log_path for b in self.brokers}

    def describe(self) -> str:
        return f"{self.ensemble.modes()}\n{self.log_tails(40)}\n{self.ensemble.log_tails(10)}"


def _delete_links() -> None:
    for line in run(["ip", "-o", "link", "show"], timeout=10, check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            run(["ip", "link", "del", name], timeout=10, check=False)


def clean_leftovers() -> None:
    """What an earlier run that died left: its namespaces and processes, links, mounts, throttles."""
    for line in run(["ip", "netns", "list"], timeout=10, check=False).stdout.splitlines():
        name = line.split(" ")[0]
        if name.startswith(PREFIX):
            _kill_namespace(name)
    _delete_links()
    disks.unthrottle_all()
    for mount in disks.leftover_mounts("/zk-nemesis-"):
        disks.unmount(Path(mount))

