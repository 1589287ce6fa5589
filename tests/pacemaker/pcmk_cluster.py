"""A real three-node Corosync/Pacemaker cluster on one machine, running haqueue under the OCF agent.

Layout (every name starts with `hqpm`, every address is in 10.213.47.0/24; nothing else is touched):

    root namespace      bridge hqpm-br 10.213.47.1/24; the tests' clients and admin calls
    hqpm1..hqpm3        network namespaces; veth eth0 10.213.47.11..13 (host end hqpmN-h on the
                        bridge); each node boots in its own mount and UTS namespace
                        (`ip netns exec NS unshare --mount --uts --propagation private boot.sh`)
                        with private directories bind-mounted over /run, /var/lib/pacemaker,
                        /var/log/pacemaker, /var/lib/corosync, /etc/corosync, /dev/shm (tmpfs),
                        /etc/haqueue, /var/lib/haqueue, /var/log/haqueue, and the repository's
                        agents/ over /usr/lib/ocf/resource.d/haqueue (so the agent under test is
                        ocf:haqueue:haqueue); hostname nodeN
    VIP                 10.213.47.100/24 on eth0 of the primary's node (ocf:heartbeat:IPaddr2)

Each node runs `corosync -f` and `pacemakerd` from a seeded CIB (stonith disabled, dc-deadtime
2 s), so the cluster is online in a few seconds. The resources are created by the project's own
`packaging/pcs-setup.sh`. Brokers listen on 0.0.0.0:5672 (clients, through the VIP) and on the
node's address :5673 (peers, `ha.brokers`).

Tools run inside a node with `nsenter` into the namespaces of its boot process, so they see that
node's /run, /etc/corosync, CIB and agent. Every wait polls with a deadline. `destroy()` kills
the cluster and removes every namespace, bridge, process and mount point it made, also after a
failure, and `clean_leftovers()` removes those of an earlier run that died.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, TypeVar

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from harness import run_haqueue, wait_for  # noqa: E402

from haqueue.admin import AdminClient, AdminError  # noqa: E402

PREFIX = "hqpm"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.213.47"
HOST_ADDRESS = f"{SUBNET}.1"
VIP = f"{SUBNET}.100"
CLIENT_PORT = 5672
PEER_PORT = 5673
VIP_ADDRESS = f"{VIP}:{CLIENT_PORT}"
RESOURCE = "haqueue"
CLONE = f"{RESOURCE}-clone"
VIP_RESOURCE = f"{RESOURCE}-vip"
HA_USER = "ha"
BINARY = REPO / ".venv" / "bin" / "haqueue"
PING_TIMEOUT = 2
BACKUP_TIMEOUT = 3.0
# The total-outage test keeps the freshest broker away for several seconds, which must stay within it: at 20 s, under
# load 16, it came back later than that after the others, and a staler one was promoted, as designed. No test waits
# for it to pass.
RECOVERY_WAIT = 60.0
POLL_INTERVAL = 0.2  # of `wait_for` on the cluster: each poll runs crm_mon, pcs or nsenter

# Host directories that the nodes bind-mount over: created if missing, removed again if we made them.
MADE_MARKER = ".made-by-hqpm-tests"
MOUNT_POINTS = ["/etc/haqueue", "/var/lib/haqueue", "/var/log/haqueue", "/usr/lib/ocf/resource.d/haqueue"]
NEEDED_PROGRAMS = ["ip", "nsenter", "unshare", "corosync", "pacemakerd", "crm_mon", "crm_attribute",
                   "cibadmin", "pcs", "corosync-cfgtool"]


def run(cmd: list[str], timeout: float = 30.0, check: bool = True, env: dict | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


def missing_programs() -> list[str]:
    return [p for p in NEEDED_PROGRAMS if shutil.which(p) is None] + \
        ([] if Path("/usr/lib/ocf/resource.d/heartbeat/IPaddr2").exists() else ["IPaddr2 (resource-agents)"])


def namespaces_work() -> str | None:
    """None if this machine can make network namespaces, veths and bridges; else why not."""
    probe = f"{PREFIX}-probe"
    try:
        run(["ip", "netns", "add", probe], timeout=10)
        try:
            run(["ip", "netns", "exec", probe, "unshare", "--mount", "--uts", "--propagation", "private",
                 "true"], timeout=10)
        finally:
            run(["ip", "netns", "del", probe], timeout=10, check=False)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None


def _netns_pids(ns: str) -> list[int]:
    proc = run(["ip", "netns", "pids", ns], timeout=10, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _kill_namespace(ns: str, init: int | None = None) -> None:
    """SIGKILL every process in the network namespace, the node's init (which reaps the others) last."""
    for _ in range(50):
        pids = _netns_pids(ns)
        if not pids or pids == [init]:
            break
        for pid in pids:
            if pid != init:
                try:
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    if init is not None:
        try:
            os.kill(init, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run(["ip", "netns", "del", ns], timeout=10, check=False)


def _remove_made_mount_point(path: str) -> None:
    """Remove a mount point directory this harness made, if nothing but its marker is in it."""
    try:
        if os.listdir(path) == [MADE_MARKER]:
            os.unlink(os.path.join(path, MADE_MARKER))
            os.rmdir(path)
    except OSError:
        pass


def clean_leftovers() -> None:
    """Remove what an earlier run that died left: its namespaces (and their processes), its bridge
    and veths, the mount points it made."""
    listed = run(["ip", "netns", "list"], timeout=10, check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        if name.startswith(PREFIX):
            _kill_namespace(name)
    _delete_links()
    for path in MOUNT_POINTS:
        _remove_made_mount_point(path)


def _delete_links() -> None:
    """The bridge and the host ends of the veths (deleting one end deletes the pair, even if
    the kernel has not yet freed the namespace that held the other end)."""
    for line in run(["ip", "-o", "link", "show"], timeout=10, check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            run(["ip", "link", "del", name], timeout=10, check=False)


class Namespaced(Protocol):
    """A node with a network namespace of its own, reached over a veth on the bridge."""

    @property
    def ns(self) -> str: ...

    @property
    def veth(self) -> str: ...

    @property
    def ip(self) -> str: ...


def bridge_namespaces(bridge: str, host_address: str, nodes: Iterable[Namespaced]) -> None:
    """A bridge in the root namespace at host_address/24, and each node's namespace on it: veth eth0 at its ip."""
    run(["ip", "link", "add", bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{host_address}/24", "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])
    for node in nodes:
        run(["ip", "netns", "add", node.ns])
        run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.ns])
        run(["ip", "link", "set", node.veth, "master", bridge, "up"])
        inside = ["ip", "netns", "exec", node.ns]
        run([*inside, "ip", "addr", "add", f"{node.ip}/24", "dev", "eth0"])
        run([*inside, "ip", "link", "set", "eth0", "up"])
        run([*inside, "ip", "link", "set", "lo", "up"])


@dataclass
class Node:
    index: int
    root: Path
    boot: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def ns(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def veth(self) -> str:
        return f"{PREFIX}{self.index}-h"

    @property
    def ip(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def peer_address(self) -> str:
        return f"{self.ip}:{PEER_PORT}"

    def dir(self, name: str) -> Path:
        return self.root / name

    @property
    def broker_log(self) -> Path:
        return self.dir("log-haqueue") / "haqueue.log"

    @property
    def pidfile(self) -> Path:
        return self.dir("run") / "resource-agents" / f"haqueue-{RESOURCE}.pid"


class PacemakerCluster:
    binary: Path = BINARY  # the agent's `binary` parameter: the haqueue command on every node

    def __init__(self, size: int = 3) -> None:
        self.base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
        self.password = secrets.token_hex(12)
        self.nodes = [Node(i, self.base / f"node{i}") for i in range(1, size + 1)]
        self.made_mount_points: list[str] = []
        self.stopped_pids: set[int] = set()  # SIGSTOPped by a test: SIGCONTed at teardown

    # ---- building -----------------------------------------------------------------------------
    def create(self) -> None:
        clean_leftovers()
        self._network()
        self._mount_points()
        seed = self._seed_cib()
        for node in self.nodes:
            self._prepare(node, seed)
        for node in self.nodes:
            self._boot(node)
        self.wait_online()
        self.setup_resources()

    def _network(self) -> None:
        bridge_namespaces(BRIDGE, HOST_ADDRESS, self.nodes)

    def _mount_points(self) -> None:
        for path in MOUNT_POINTS:
            if not os.path.lexists(path):
                os.makedirs(path)
                Path(path, MADE_MARKER).touch()  # so that a later run can tell it made this one
                self.made_mount_points.append(path)
            elif not os.path.isdir(path):
                raise RuntimeError(f"{path} exists and is not a directory: cannot mount the node's own over it")

    def _seed_cib(self) -> Path:
        """An empty CIB with stonith disabled and a 2 s dc-deadtime: online in seconds, not 20+."""
        seed = self.base / "seed-cib.xml"
        seed.write_text(run(["cibadmin", "--empty"]).stdout)
        env = {**os.environ, "CIB_file": str(seed)}
        for name, value in (("stonith-enabled", "false"), ("dc-deadtime", "2s"),
                            ("no-quorum-policy", "stop")):
            run(["crm_attribute", "-t", "crm_config", "-n", name, "-v", value], env=env)
        return seed

    def _prepare(self, node: Node, seed: Path) -> None:
        hacluster = ("hacluster", "haclient")
        for name in ("run", "lib-pacemaker", "log-pacemaker", "lib-corosync", "etc-corosync",
                     "etc-haqueue", "lib-haqueue", "log-haqueue"):
            node.dir(name).mkdir(parents=True)
        for sub in ("cib", "pengine", "blackbox", "cores"):
            d = node.dir("lib-pacemaker") / sub
            d.mkdir(mode=0o750)
            shutil.chown(d, *hacluster)
        shutil.chown(node.dir("log-pacemaker"), *hacluster)
        node.dir("log-pacemaker").chmod(0o770)
        cib = node.dir("lib-pacemaker") / "cib" / "cib.xml"
        shutil.copy(seed, cib)
        shutil.chown(cib, *hacluster)
        cib.chmod(0o600)
        (node.dir("etc-corosync") / "corosync.conf").write_text(self._corosync_conf())
        self.write_broker_configs(node)
        mounts = [("run", "/run"), ("lib-pacemaker", "/var/lib/pacemaker"), ("log-pacemaker", "/var/log/pacemaker"),
                  ("lib-corosync", "/var/lib/corosync"), ("etc-corosync", "/etc/corosync"),
                  ("etc-haqueue", "/etc/haqueue"), ("lib-haqueue", "/var/lib/haqueue"),
                  ("log-haqueue", "/var/log/haqueue")]
        lines = ["#!/bin/sh", "# boots one cluster node inside its own namespaces (tests/pacemaker)", "set -e"]
        lines += [f"mount --bind {node.dir(src)} {dst}" for src, dst in mounts]
        lines += [f"mount --bind {REPO / 'agents'} /usr/lib/ocf/resource.d/haqueue",
                  "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
                  f"hostname {node.name}",
                  f"exec python3 -I {Path(__file__).with_name('node_init.py')} {node.root}"]
        (node.root / "boot.sh").write_text("\n".join(lines) + "\n")

    def write_broker_configs(self, node: Node) -> None:
        """The node's /etc/haqueue (before it boots): one broker, one of the cluster's HA group."""
        self.write_broker_config(node, "haqueue.yaml", {
            "name": node.name,
            "listen": [f"0.0.0.0:{CLIENT_PORT}", f"{node.ip}:{PEER_PORT}"],
            "data_dir": "/var/lib/haqueue",
            "ha": self.ha_section([n.peer_address for n in self.nodes]),
        })

    def ha_section(self, brokers: list[str]) -> dict:
        return {"brokers": brokers, **self.ha_credentials()}

    def ha_credentials(self) -> dict:
        return {"username": HA_USER, "password": self.password, "backup_timeout": BACKUP_TIMEOUT,
                "recovery_wait": RECOVERY_WAIT}

    @staticmethod
    def write_broker_config(node: Node, name: str, config: dict) -> None:
        conf = node.dir("etc-haqueue") / name
        conf.write_text(yaml.safe_dump(config, sort_keys=False))
        conf.chmod(0o600)

    def _corosync_conf(self) -> str:
        nodes = "\n".join(f"    node {{\n        name: {n.name}\n        nodeid: {n.index}\n"
                          f"        ring0_addr: {n.ip}\n    }}" for n in self.nodes)
        return (
            "totem {\n    version: 2\n    cluster_name: hqpm\n    transport: knet\n"
            "    crypto_cipher: none\n    crypto_hash: none\n}\n"
            f"nodelist {{\n{nodes}\n}}\n"
            "quorum {\n    provider: corosync_votequorum\n}\n"
            "logging {\n    to_logfile: yes\n    logfile: /var/log/pacemaker/corosync.log\n"
            "    to_stderr: no\n    to_syslog: no\n    timestamp: on\n}\n")

    def _boot(self, node: Node) -> None:
        out = open(node.root / "boot.out", "ab")
        node.boot = subprocess.Popen(
            ["ip", "netns", "exec", node.ns, "unshare", "--mount", "--uts", "--propagation", "private",
             "sh", str(node.root / "boot.sh")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    # ---- running things on a node ---------------------------------------------------------------
    def on(self, node: Node, cmd: list[str], timeout: float = 30.0, check: bool = True,
           env: dict | None = None) -> subprocess.CompletedProcess:
        """Run `cmd` inside the node (its network, mount and UTS namespaces)."""
        if node.boot is None or node.boot.poll() is not None:
            raise RuntimeError(f"{node.name} is not running (boot exited with "
                               f"{node.boot.returncode if node.boot else None}); see {node.root}/boot.out")
        return run(["nsenter", "-t", str(node.boot.pid), "-m", "-u", "-n", "--", *cmd],
                   timeout=timeout, check=check, env=env)

    def pcs(self, *args: str, node: Node | None = None, timeout: float = 60.0, check: bool = True):
        return self.on(node or self.any_member(), ["pcs", *args], timeout=timeout, check=check)

    def any_member(self) -> Node:
        """A node of the quorate partition (the first one that is online and has quorum)."""
        for node in self.nodes:
            status = self.try_status(node)
            if status is not None and status.quorate:
                return node
        return self.nodes[0]

    # ---- cluster status --------------------------------------------------------------------------
    def status(self, node: Node | None = None) -> "ClusterStatus":
        out = self.on(node or self.nodes[0], ["crm_mon", "-1", "--output-as=xml"], timeout=20).stdout
        return ClusterStatus(ET.fromstring(out))

    def try_status(self, node: Node | None = None) -> "ClusterStatus | None":
        try:
            return self.status(node)
        except (RuntimeError, ET.ParseError, subprocess.TimeoutExpired):
            return None

    def wait_online(self, timeout: float = 60.0) -> None:
        def online():
            s = self.try_status()
            return s is not None and s.dc and len(s.online) == len(self.nodes)
        wait_for(online, timeout, interval=POLL_INTERVAL, message="every node online with a DC")

    def setup_resources(self) -> None:
        env = {**os.environ, "VIP": VIP, "CIDR_NETMASK": "24", "NIC": "eth0", "BINARY": str(self.binary),
               "PING_TIMEOUT": str(PING_TIMEOUT), "NODES": str(len(self.nodes)), "RESOURCE": RESOURCE}
        self.on(self.nodes[0], ["sh", str(REPO / "packaging" / "pcs-setup.sh")], timeout=120, env=env)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # ---- brokers -------------------------------------------------------------------------------
    def admin(self, node: Node, timeout: float = 3.0) -> AdminClient:
        return AdminClient(node.peer_address, timeout, HA_USER, self.password)

    def broker_status(self, node: Node, timeout: float = 3.0) -> dict | None:
        try:
            with self.admin(node, timeout) as client:
                code, _, body = client.request("READ", "ha")
            return body if code < 400 else None
        except AdminError:
            return None

    def cli(self, node: Node, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`haqueue admin -b NODE:5673 --user ha ARGS` (this build's command, from the root namespace), the password
        in $HAQUEUE_PASSWORD; raises with its output if it fails, unless not `check`."""
        proc = run_haqueue(["admin", "-b", node.peer_address, "--user", HA_USER, *args],
                           env={"HAQUEUE_PASSWORD": self.password})
        if check and proc.returncode != 0:
            raise RuntimeError(f"haqueue admin {' '.join(args)} at {node.name} exited with {proc.returncode}:\n"
                               f"{proc.stdout}{proc.stderr}")
        return proc

    def queue_depth(self, node: Node, queue: str) -> int | None:
        try:
            with self.admin(node) as client:
                code, _, body = client.request("READ", "queue", queue)
            return body["depth"] if code < 400 else None
        except AdminError:
            return None

    def broker_pid(self, node: Node) -> int | None:
        try:
            return int(node.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def broker_pids_in(self, node: Node) -> list[int]:
        """Every haqueue broker process inside the node's network namespace."""
        found = []
        for pid in _netns_pids(node.ns):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"broker" in cmdline and any(b"haqueue" in part for part in cmdline):
                found.append(pid)
        return found

    def promotion_score(self, node: Node) -> str | None:
        proc = self.on(self.any_member(), ["crm_attribute", "-N", node.name, "-l", "reboot",
                                           "-n", f"master-{RESOURCE}", "-G", "-q"], check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def vip_on(self, node: Node) -> bool:
        out = self.on(node, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], check=False).stdout
        return f" {VIP}/" in out

    # ---- health ----------------------------------------------------------------------------------
    def healthy(self, allow_failures: bool = False, view: Node | None = None) -> tuple[bool, str]:
        """One primary (active) whose node holds the VIP, every other broker a ready backup following
        it, and (unless allowed) no failed actions."""
        s = self.try_status(view)
        if s is None:
            return False, "no cluster status"
        if len(s.online) != len(self.nodes):
            return False, f"online: {s.online}"
        promoted = s.instances("Promoted")
        if len(promoted) != 1:
            return False, f"promoted instances: {promoted}"
        unpromoted = s.instances("Unpromoted")
        if len(unpromoted) != len(self.nodes) - 1:
            return False, f"unpromoted instances: {unpromoted}"
        if s.vip_node != promoted[0]:
            return False, f"VIP on {s.vip_node}, primary on {promoted[0]}"
        if s.failures and not allow_failures:
            return False, f"failed actions: {s.failures}"
        primary = self.node(promoted[0])
        ps = self.broker_status(primary)
        if not ps or ps.get("role") != "primary" or ps.get("state") != "active":
            return False, f"{primary.name}: {ps}"
        for name in unpromoted:
            bs = self.broker_status(self.node(name))
            if not bs or bs.get("role") != "backup" or bs.get("state") != "ready" or not bs.get("primary"):
                return False, f"{name}: {bs and {k: bs.get(k) for k in ('role', 'state', 'primary')}}"
        return True, f"primary {primary.name}"

    def wait_healthy(self, timeout: float = 60.0, allow_failures: bool = False) -> "Node":
        last = [""]

        def check():
            ok, why = self.healthy(allow_failures)
            last[0] = why
            return ok
        try:
            wait_for(check, timeout, interval=0.5, message="a healthy cluster")
        except AssertionError as e:
            raise AssertionError(f"{e}: {last[0]}\n{self.describe()}") from None
        return self.primary_node()

    def wait_new_primary(self, old: Node, timeout: float = 30.0, view: Node | None = None) -> Node:
        """Until another node's instance is promoted, its broker is primary and it holds the VIP
        (as `view` sees the cluster); returns that node."""
        found: list[Node | None] = [None]

        def moved():
            s = self.try_status(view)
            promoted = s.instances("Promoted") if s else []
            if len(promoted) != 1 or promoted[0] == old.name or s.vip_node != promoted[0]:
                return False
            node = self.node(promoted[0])
            st = self.broker_status(node)
            if not st or st.get("role") != "primary" or not self.vip_on(node):
                return False
            found[0] = node
            return True
        try:
            wait_for(moved, timeout, interval=0.1, message=f"a primary other than {old.name} with the VIP")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None
        return found[0]

    def primary_node(self) -> Node | None:
        s = self.try_status()
        promoted = s.instances("Promoted") if s else []
        return self.node(promoted[0]) if len(promoted) == 1 else None

    def restore(self, timeout: float = 90.0) -> Node:
        """Back to healthy between tests: no move/ban constraints, no failure records. Through crm_resource, which
        `pcs resource clear` and `pcs resource cleanup` call: pcs itself is a Python program that costs a second of
        CPU a call (the tests that check pcs's commands run them)."""
        for node in self.nodes:
            run(["ip", "link", "set", node.veth, "up"], check=False)
        for pid in list(self.stopped_pids):
            self.sigcont(pid)
        member = self.any_member()
        self.on(member, ["crm_resource", "--clear", "--resource", CLONE], check=False)
        self.on(member, ["crm_resource", "--cleanup"], check=False)
        return self.wait_healthy(timeout)

    def sigstop(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.stopped_pids.add(pid)

    def sigcont(self, pid: int) -> None:
        self.stopped_pids.discard(pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def describe(self) -> str:
        """Cluster status and the tails of the logs, for failure messages."""
        parts = []
        for node in self.nodes:
            try:
                parts.append(f"==== crm_mon on {node.name}\n" + self.on(node, ["crm_mon", "-1", "-r", "-f"],
                                                                          check=False, timeout=20).stdout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                parts.append(f"==== crm_mon on {node.name}: {e}")
            for log in (node.broker_log, node.dir("log-pacemaker") / "pacemaker.log"):
                try:
                    lines = log.read_text(errors="replace").splitlines()[-25:]
                except OSError:
                    lines = ["(none)"]
                parts.append(f"==== {log}\n" + "\n".join(lines))
        return "\n".join(parts)

    # ---- tearing down -------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Kill everything and remove it all, also after a failure. Nothing is stopped cleanly first: no test looks
        at a cluster going down, and what a node holds (its /run, /dev/shm, mounts, VIP and IPC sockets) goes with
        its namespaces. A clean stop (stop-all-resources, then pacemakerd --shutdown and corosync-cfgtool -H node
        after node) took 10-20 s a cluster."""
        self.stopped_pids.clear()  # _kill_namespace wakes them to kill them
        for node in self.nodes:
            _kill_namespace(node.ns, node.boot.pid if node.boot is not None else None)
            if node.boot is not None:
                try:
                    node.boot.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        _delete_links()
        for path in reversed(self.made_mount_points):
            _remove_made_mount_point(path)
        self.made_mount_points.clear()

    def remove_files(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


Cluster = TypeVar("Cluster", bound=PacemakerCluster)


def running(make: Callable[[], Cluster], ready: Callable[[Cluster], object]) -> Iterator[Cluster]:
    """The body of a module fixture (`yield from running(...)`): a cluster made, booted and `ready`, torn down
    afterwards whatever happens; skipped, with the reason, when not root or without network namespaces."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the cluster runs in network namespaces with bind mounts")
    why = namespaces_work()
    if why is not None:
        pytest.skip(f"cannot create network namespaces here: {why}")
    missing = missing_programs()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: apt-get install pacemaker corosync pcs resource-agents "
                    "pacemaker-cli-utils libxml2-utils (make setup does)", pytrace=False)
    cluster = make()
    try:
        cluster.create()
        ready(cluster)
        yield cluster
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.destroy()
        if os.environ.get("HAQUEUE_PCMK_KEEP"):
            print(f"cluster files kept in {cluster.base}")
        else:
            cluster.remove_files()


class ClusterStatus:
    """The parts of `crm_mon --output-as=xml` the tests look at."""

    def __init__(self, root: ET.Element) -> None:
        self.root = root
        dc = root.find("./summary/current_dc")
        self.dc = dc is not None and dc.get("present") == "true"
        quorum = dc.get("with_quorum") if dc is not None else None
        self.quorate = quorum == "true"
        self.online = [n.get("name") for n in root.findall("./nodes/node") if n.get("online") == "true"]
        self.failures = [dict(f.attrib) for f in root.findall("./failures/failure")]

    def instances(self, role: str) -> list[str]:
        """Nodes where an instance of the clone is active in `role` (Promoted, Unpromoted)."""
        found = []
        for r in self.root.findall(f"./resources/clone[@id='{CLONE}']/resource"):
            if r.get("role") == role and r.get("active") == "true" and r.get("failed") != "true":
                found += [n.get("name") for n in r.findall("node")]
        return found

    @property
    def vip_node(self) -> str | None:
        r = self.root.find(f"./resources/resource[@id='{VIP_RESOURCE}']")
        if r is None or r.get("role") != "Started" or r.get("active") != "true":
            return None
        node = r.find("node")
        return node.get("name") if node is not None else None
