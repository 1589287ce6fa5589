"""Fixtures for the shard tests: sharded clusters of real processes, always stopped after the test."""
from __future__ import annotations

import pytest

from shard_harness import ShardCluster
from ha_harness import cluster_factory


@pytest.fixture
def shard_cluster(tmp_path):
    yield from cluster_factory(ShardCluster, tmp_path)
