"""Rolling upgrades of `haqueue cluster up` clusters from the previous release, under load, as README's procedure
does them (rolling.py): nothing confirmed is lost, and nothing is duplicated beyond what was in flight; the new
release's feature flag is then enabled under load."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import yaml

import rolling
from ha_harness import HA_USER, AdminClient, Load, wait_for
from harness import REPO_ROOT
from releases import summary
from haqueue import __version__
from shard_harness import owned_by
from test_ha_supervisor import Supervised
from test_sharded_cluster_up import node_pids


def test_cluster_up_rolling_upgrade_under_load(tmp_path, previous):
    # no loss, duplicates within what was in flight; then the new feature enabled and kept by every broker
    outcome = rolling.cluster_up(tmp_path, previous.tree, REPO_ROOT, features=FEATURES)
    print(summary(previous.version, __version__, outcome.report, outcome.steps), outcome)
    assert outcome.before == {previous.version} and outcome.after == {__version__}, outcome


FEATURES = ("diverged-file-header", "mirror")  # the feature flags of 0.2.0
SHARDS = 2  # each node holds a replica of both: the relays cross nodes, and 6 processes restart instead of 9


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
