"""Fixtures for the shard tests: sharded clusters of real processes, always stopped after the test."""
from __future__ import annotations

import pytest

from shard_harness import ShardCluster
from ha_harness import cluster_factory


@pytest.fixture
def shard_cluster(tmp_path):
    yield from cluster_factory(ShardCluster, tmp_path)


@pytest.fixture
def two_shards(shard_cluster):
    """A started cluster of 2 nodes and 2 shards of 2 replicas (ha.backup_timeout and shard.relay_timeout 2 s): n1 hosts shard 0's
    primary and a backup of shard 1, n2 the reverse."""
    c = shard_cluster(size=2, shards=2, replicas=2)
    c.start_shards()
    return c
