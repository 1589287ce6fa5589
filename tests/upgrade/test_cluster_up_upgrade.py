"""A rolling upgrade of a `haqueue cluster up` cluster, as README's procedure does it: the new release installed
where the old one was (here a symlink re-pointed, as an install replaces the files), then each broker stopped in
turn, backups first, and the supervisor (the previous release's, still running) restarts it from the new files;
the primary last, when the supervisor fails over to an upgraded backup. Under load, nothing confirmed is lost."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import yaml

from ha_harness import HA_USER, AdminClient, Load, wait_for
from harness import REPO_ROOT
from haqueue import __version__
from shard_harness import owned_by
from test_ha_supervisor import Supervised
from test_sharded_cluster_up import node_pids


def test_cluster_up_rolling_upgrade_under_load(tmp_path, previous):
    installed = tmp_path / "installed"  # what the brokers run: the previous release, then this build
    installed.symlink_to(previous.tree)
    (tmp_path / "cluster").mkdir()
    s = Supervised(tmp_path / "cluster", 3, code=installed)
    try:
        s.read_until("public ", 60)
        addresses = {f"broker-{i}": f"127.0.0.1:{s.base + i}" for i in range(3)}

        def version(name: str) -> str | None:
            try:
                with s.admin(addresses[name]) as a:
                    return a.request("READ", "broker")[2]["version"]
            except Exception:  # noqa: BLE001 - restarting
                return None

        def role(name: str) -> tuple[str, str] | None:
            status = s.status(addresses[name])
            return (status["role"], status["state"]) if status else None

        assert {version(name) for name in addresses} == {previous.version}
        wait_for(lambda: sorted(role(n) for n in addresses) == [("backup", "ready")] * 2 + [("primary", "active")],
                 30, message="a primary and two ready backups")
        load = Load(s.public, "upgrade").start()
        outages = []
        try:
            load.wait_confirmed(200, 30)
            (tmp_path / "next").symlink_to(REPO_ROOT)
            os.replace(tmp_path / "next", installed)  # the new release installed in place
            primary = next(n for n in addresses if role(n) == ("primary", "active"))
            for name in [n for n in addresses if n != primary] + [primary]:
                began = time.monotonic()
                os.kill(s.broker_pid(name), signal.SIGTERM)
                wait_for(lambda: version(name) not in (None, previous.version), 60,
                         message=f"{name} restarted by the supervisor on the new release")
                wait_for(lambda: role(name) == ("backup", "ready"), 60, message=f"{name} a ready backup again")
                load.wait_confirmed(200, 30)
                outages.append(load.outage_after(began))
            upgraded = {version(n) for n in addresses}
            assert previous.version not in upgraded and None not in upgraded, upgraded
            load.stop_producer()
            wait_for(lambda: set(load.confirmed) <= set(load.received), 30,
                     message=f"every confirmed message received ({load.report()})")
        finally:
            load.stop()
        report = load.report()
        print("cluster up rolling upgrade:", report, "client outage per step (s):", outages)
        assert report["lost"] == [], report
        assert len(report["duplicates"]) <= len(load.error_times) + 20, report  # what was in flight
    finally:
        s.close()
        for name in ("broker-0", "broker-1", "broker-2"):
            log = s.directory / f"{name}.log"
            if log.exists():
                print(f"==== {name} ====\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        print("==== supervisor stderr ====\n" + s.stderr())


SHARDS = 3


def ha_status(address: str, password: str) -> dict[str, Any]:
    """A process's ha status at its peer address; {} while it does not answer."""
    try:
        with AdminClient(address, 2.0, HA_USER, password) as admin:
            return admin.request("READ", "ha")[2]
    except Exception:  # noqa: BLE001 - restarting
        return {}


def test_sharded_cluster_rolling_upgrade_under_load(tmp_path, previous):
    """`cluster up --shards`: node by node, every process of the node stopped and restarted by its shard's
    supervisor on the new release; each shard's primary there moves to an upgraded or old replica meanwhile."""
    installed = tmp_path / "installed"
    installed.symlink_to(previous.tree)
    (tmp_path / "cluster").mkdir()
    s = Supervised(tmp_path / "cluster", 3, args=("--shards", str(SHARDS)), ports=2 * SHARDS, code=installed)
    try:
        lines = s.read_until("nodes ", 180)
        password = yaml.safe_load((s.directory / "cluster.yaml").read_text())["ha"]["password"]
        # Each through a node's client address, which relays to its shard's primary: a client of the node being
        # upgraded waits for that node's processes to be back (a client given every node's address would not).
        nodes = next(line for line in lines if line.startswith("nodes ")).split()[1:]
        loads = [Load(nodes[shard % len(nodes)], owned_by(shard, "up", SHARDS)).start() for shard in range(SHARDS)]
        try:
            for load in loads:
                load.wait_confirmed(100, 60)
            (tmp_path / "next").symlink_to(REPO_ROOT)
            os.replace(tmp_path / "next", installed)
            for node in ("n1", "n2", "n3"):
                began = time.monotonic()
                pids = node_pids(s, node)
                assert len(pids) == SHARDS, pids  # a replica of every shard on every node
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)
                wait_for(lambda: len(set(node_pids(s, node)) - set(pids)) == SHARDS, 60,
                         message=f"{node}'s processes restarted by their supervisors")
                host = f"127.0.0.{node[1:]}"
                for shard in range(SHARDS):  # each a ready backup of this build before the next node stops
                    wait_for(lambda: ha_status(f"{host}:{s.base + shard}", password).get("state") == "ready", 60,
                             message=f"{node}'s process of shard {shard} ready again")
                    assert ha_status(f"{host}:{s.base + shard}", password)["release"] == __version__
                for load in loads:
                    load.wait_confirmed(100, 60)
                print(node, "upgraded; client outage per shard (s):", [load.outage_after(began) for load in loads])
            for load in loads:
                load.stop_producer()
            for load in loads:
                wait_for(lambda: set(load.confirmed) <= set(load.received), 60,
                         message=f"every confirmed message received ({load.report()})")
        finally:
            for load in loads:
                load.stop()
        for shard, load in enumerate(loads):
            report = load.report()
            print(f"shard {shard}:", report)
            assert report["lost"] == [], report
            assert len(report["duplicates"]) <= len(load.error_times) + 20 * 3, report
    finally:
        s.close()
        print("==== supervisor stderr ====\n" + s.stderr())
