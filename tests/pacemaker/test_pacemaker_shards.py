"""A sharded haqueue under a real three-node Pacemaker cluster, set up by packaging/pcs-shard-setup.sh from
`haqueue place`'s JSON (pcmk_shards.py): each shard's clone is promoted on its preferred primary's node, and
a shard whose primary is killed fails over to its ready backup, then back to its preferred node."""
from __future__ import annotations

import os
import signal
import time

import pytest

from harness import wait_for
from pcmk_shards import SHARD_CLIENT_PORT, ShardLoad

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_each_shard_is_promoted_on_its_preferred_node_with_a_vip_per_node(sharded_pcmk_cluster):
    c = sharded_pcmk_cluster
    assert c.replicas == {0: ["node1", "node2"], 1: ["node2", "node3"]}
    ok, why = c.preferred_primaries()  # the fixture waited for it: still so
    assert ok, why
    for shard, replicas in c.replicas.items():
        primary = c.shard_broker(c.node(replicas[0]), shard)
        # epoch 1, or 2 when another replica's first monitor scored before the preferred one's and that
        # broker was promoted first: then the 9500 moved the primary once the preferred broker was ready
        assert primary["name"] == f"{replicas[0]}.s{shard}" and primary["epoch"] in (1, 2)
    for node in c.nodes:
        assert c.roles(f"haqueue-vip-{node.name}") == {node.name: "Started"}


def test_a_killed_shard_primary_fails_over_and_back_to_its_preferred_node_losing_nothing(sharded_pcmk_cluster):
    """kill -9 of shard 0's primary on its preferred node: Pacemaker promotes the ready backup on the other
    replica's node (not the killed broker restarted in place, which joins with no score); once that broker
    has caught up and is ready, the 9500 moves the primary back. A producer runs throughout."""
    c = sharded_pcmk_cluster
    c.wait_preferred_primaries()
    preferred, other = (c.node(n) for n in c.replicas[0])
    epoch = c.shard_broker(preferred, 0)["epoch"]
    load = ShardLoad([f"{n.ip}:{SHARD_CLIENT_PORT}" for n in (preferred, other)], "s0-failback").start()
    try:
        wait_for(lambda: load.confirmed_count() >= 50, 30, message="50 confirmed before the kill")
        os.kill(c.shard_pid(preferred, 0), signal.SIGKILL)
        killed = time.monotonic()

        def other_primary() -> bool:
            status = c.shard_broker(other, 0)
            return c.roles("haqueue-s0").get(other.name) == "Promoted" and bool(status) and \
                status["role"] == "primary"
        wait_for(other_primary, 60, interval=0.2, message=f"shard 0 primary on {other.name}")
        took_over = time.monotonic() - killed
        base = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= base + 50, 30, message="50 confirmed by the new primary")
        c.wait_preferred_primaries(120)
        failed_back = time.monotonic() - killed
        base = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= base + 50, 30, message="50 confirmed after the failback")
    finally:
        load.stop()
    report = load.report()
    print(f"shard 0: {other.name} primary {took_over:.1f}s after the kill, back on {preferred.name} after "
          f"{failed_back:.1f}s; {report}")
    assert report["lost"] == [], report
    assert c.shard_broker(preferred, 0)["epoch"] == epoch + 2  # two failovers: the kill, the failback
