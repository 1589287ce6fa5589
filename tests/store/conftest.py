"""The store's tests use the integration suite's clients (tests/integration/clients.py)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))

import pytest  # noqa: E402

from ha_harness import HaCluster, cluster_factory  # noqa: E402


@pytest.fixture
def ha_cluster(tmp_path):
    """As in tests/ha: clusters of real broker processes, always cleaned up."""
    yield from cluster_factory(HaCluster, tmp_path)
