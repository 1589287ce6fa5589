"""Step 2 of design/sharding.md: every (node, shard) process runs from the one cluster file, the processes of
a node share its client port, and each shard is an HA group of its own."""
from __future__ import annotations

from harness import listening_ports
from ha_harness import receive, send_all
from shard_harness import owned_by


def test_each_shard_runs_as_its_own_ha_group_from_one_cluster_file(shard_cluster) -> None:
    c = shard_cluster(size=2, shards=2, replicas=2)
    c.start_shards()
    for node in c.hosts:  # both of the node's shard processes bound its client address (SO_REUSEPORT)
        for b in c.brokers:
            if b.node == node:
                assert c.client_port in listening_ports(b.pid)
    for shard in range(2):
        primary, backup = c.shard_processes(shard)
        status = c.status(primary)
        assert (status["name"], status["role"], status["public"]) == (primary.name, "primary", c.publics[shard])
        assert status["brokers"] == [primary.address, backup.address]
        send_all(c.publics[shard], owned_by(shard, "q"), [f"s{shard}-{i}" for i in range(20)])
    for shard in range(2):  # each shard holds its own queue, on its primary and its backup, and no other
        primary, backup = c.shard_processes(shard)
        queue = owned_by(shard, "q")
        c.wait_depth(backup, queue, 20)
        assert owned_by(1 - shard, "q") not in c.queues(primary)
        assert [m.body for m in receive(c.publics[shard], queue, 20)] == [f"s{shard}-{i}" for i in range(20)]
