"""Step 5 of design/sharding.md: `haqueue cluster up --size 3 --shards 6` runs 3 simulated nodes (127.0.0.1-3)
with 6 shards of 3 replicas, one supervisor per shard. Every queue is usable from every node's client
address; kill -9 of every process of one node loses no confirmed message, and every shard whose primary
was there gets a new one."""
from __future__ import annotations

import os
import signal

import pytest
import yaml

from ha_harness import HA_USER, AdminClient, Load, receive, send_all, wait_for
from shard_harness import owned_by
from test_ha_supervisor import Supervised, _children, _cmdline

SHARDS = 6


def node_pids(s: Supervised, node: str) -> list[int]:
    return [pid for pid in _children(s.proc.pid) if f"--node {node} " in _cmdline(pid)]


def primary_name(s: Supervised, public: str) -> str | None:
    password = yaml.safe_load((s.directory / "cluster.yaml").read_text())["ha"]["password"]
    try:
        with AdminClient(public, 2.0, HA_USER, password) as admin:
            return admin.request("READ", "ha")[2]["name"]
    except Exception:  # noqa: BLE001 - no primary there (yet)
        return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_nodes_six_shards_survive_the_loss_of_a_node(tmp_path) -> None:
    (tmp_path / "cluster").mkdir()
    s = Supervised(tmp_path / "cluster", 3, args=("--shards", str(SHARDS)), ports=2 * SHARDS)
    try:
        lines = s.read_until("nodes ", 180)
        nodes = next(line for line in lines if line.startswith("nodes ")).split()[1:]
        publics = [line.split()[3] for line in lines if line.startswith("shard ")]
        led_by_n2 = [shard for shard, public in enumerate(publics) if primary_name(s, public).startswith("n2.")]
        assert len(led_by_n2) == 2  # n2 is the preferred primary of shards 1 and 4
        queues = [owned_by(shard, "sq", SHARDS) for shard in range(SHARDS)]
        for k, entry in enumerate(nodes):  # every queue from every node: sent at each...
            for queue in queues:
                send_all(entry, queue, [f"{queue}@{k}-{j}" for j in range(3)])
        for k, entry in enumerate(nodes):  # ...and received at each, in order
            for queue in queues:
                assert [m.body for m in receive(entry, queue, 3)] == [f"{queue}@{k}-{j}" for j in range(3)]
        for queue in queues:  # confirmed before the node dies
            send_all(nodes[0], queue, [f"{queue}-kept-{j}" for j in range(20)])

        def kill_n2() -> None:
            pids = node_pids(s, "n2")
            assert len(pids) == SHARDS * 3 // 3  # n2 holds a replica of every shard
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        _, report = Load(nodes[0], owned_by(led_by_n2[0], "load", SHARDS)).across(kill_n2, timeout=90)
        assert report["lost"] == [], report
        for shard in led_by_n2:  # a new primary, not on n2
            wait_for(lambda: (primary_name(s, publics[shard]) or "n2.").split(".")[0] != "n2", 60,
                     message=f"a new primary of shard {shard}")
        for queue in queues:
            assert [m.body for m in receive(nodes[2], queue, 20)] == [f"{queue}-kept-{j}" for j in range(20)]
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.close()
        print("==== supervisor stderr ====\n" + s.stderr())
