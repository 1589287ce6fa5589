"""Fixtures for the upgrade tests: the previous release, built once from git history (tests/releases.py), and
clusters whose brokers each run this build or that release (design/upgrades.md)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "shard"))  # the sharded cluster's helpers

from ha_harness import HaCluster, cluster_factory  # noqa: E402
from releases import PREVIOUS, Release  # noqa: E402


@pytest.fixture(scope="session")
def previous() -> Release:
    PREVIOUS.build()
    return PREVIOUS


@pytest.fixture
def ha_cluster(tmp_path):
    yield from cluster_factory(HaCluster, tmp_path)
