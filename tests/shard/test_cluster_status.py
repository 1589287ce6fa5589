"""Step 7 of design/sharding.md: `haqueue admin cluster status`, asked of any process of a sharded cluster, shows
every shard's primary, preferred primary, backups (state, lag) and epoch, and what each node hosts; a shard whose
primary was killed shows no primary and the dead process unreachable, until a backup is promoted."""
from __future__ import annotations

import json
from typing import Any

import pytest

from harness import run_haqueue

pytestmark = pytest.mark.timeout(180)


def cluster_status(c, address: str, *args: str) -> Any:
    out = c.cli(address, "cluster", "status", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout if args else json.loads(out.stdout)


def shard(status: dict[str, Any], i: int) -> dict[str, Any]:
    return status["shards"][i]


def roles(status: dict[str, Any]) -> dict[str, dict[str, tuple[str | None, str]]]:
    return {node["node"]: {p["name"]: (p["role"], p["state"]) for p in node["processes"]} for node in status["nodes"]}


def test_cluster_status_shows_every_shard_and_node_and_a_shard_without_primary(shard_cluster) -> None:
    c = shard_cluster(size=3, shards=3, replicas=3)  # as `cluster up --size 3 --shards 3`
    c.start_shards()
    status = cluster_status(c, c.client_address("n2"))  # any process: here whichever of n2's the kernel picks
    for i in range(3):
        s = shard(status, i)
        assert (s["primary"], s["preferred"], s["state"]) == (f"n{i + 1}.s{i}", f"n{i + 1}.s{i}", "active")
        assert s["epoch"] >= 1
        assert s["public"] == c.publics[i]
        assert [(b["name"], b["state"], b["lag"]) for b in s["backups"]] == \
            [(f"n{(i + j) % 3 + 1}.s{i}", "ready", 0) for j in (1, 2)]
    assert roles(status) == {
        "n1": {"n1.s0": ("primary", "active"), "n1.s1": ("backup", "ready"), "n1.s2": ("backup", "ready")},
        "n2": {"n2.s0": ("backup", "ready"), "n2.s1": ("primary", "active"), "n2.s2": ("backup", "ready")},
        "n3": {"n3.s0": ("backup", "ready"), "n3.s1": ("backup", "ready"), "n3.s2": ("primary", "active")}}
    table = cluster_status(c, c.client_address("n1"), "--format", "table").splitlines()
    assert table[0].split() == ["shard", "primary", "preferred", "epoch", "backup", "state", "lag", "msgs", "lag",
                                "s"]
    assert table[1].split()[:6] == ["0", "n1.s0", "n1.s0", str(shard(status, 0)["epoch"]), "n2.s0", "ready"]
    assert "n3.s2  shard" not in table and any(line.split()[:4] == ["n3", "n3.s0", "0", "backup"] for line in table)

    dead = c.process("n2", 1)
    epoch = shard(status, 1)["epoch"]
    c.kill(dead)  # kill -9 of shard 1's primary; nothing promotes another here
    status = cluster_status(c, c.client_address("n3"))
    s = shard(status, 1)
    assert (s["primary"], s["preferred"], s["epoch"]) == (None, "n2.s1", epoch)
    states = {b["name"]: b["state"] for b in s["backups"]}
    assert states["n2.s1"] == "unreachable" and states["n3.s1"] in ("ready", "joining", "catchup")
    assert roles(status)["n2"]["n2.s1"] == (None, "unreachable")
    assert [shard(status, i)["primary"] for i in (0, 2)] == ["n1.s0", "n3.s2"]  # the others carry on
    assert "(none)" in cluster_status(c, c.client_address("n1"), "--format", "table")

    c.promote(c.process("n3", 1))
    c.wait_backups_ready(c.process("n3", 1), ["n1.s1"])
    s = shard(cluster_status(c, c.client_address("n1")), 1)
    assert (s["primary"], s["preferred"]) == ("n3.s1", "n2.s1") and s["epoch"] > epoch
    assert [(b["name"], b["state"]) for b in s["backups"]] == [("n2.s1", "unreachable"), ("n1.s1", "ready")]


def test_cluster_status_asked_of_a_peer_address_or_of_a_broker_outside_a_sharded_cluster(two_shards, broker) -> None:
    c = two_shards
    out = c.cli(c.brokers[0], "cluster", "status", "--format", "table")  # a process's peer address answers too
    assert out.returncode == 0, out.stderr
    assert "n1.s0" in out.stdout
    out = run_haqueue(["admin", "-b", broker.address, "cluster", "status"])
    assert (out.returncode, out.stderr) == (1, f"haqueue: {broker.address} is not a process of a sharded cluster\n")
