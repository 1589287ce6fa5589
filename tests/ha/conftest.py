"""Fixtures for the HA tests: clusters of real broker processes, always cleaned up.

`ha_cluster`  ``ha_cluster(size=3, backup_timeout=2, replicate=None, extra=None)`` makes an
              `HaCluster` (not started); every broker it made is SIGCONTed and stopped at the
              end of the test, and the tails of their logs are printed (pytest shows them when
              the test fails). A broker that exited without the test asking fails the test.
              (`ha_harness.cluster_factory` does all that, for any fixture that makes clusters.)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))  # clients.py: unsettled sends

import pytest  # noqa: E402

from ha_harness import HaCluster, cluster_factory  # noqa: E402


@pytest.fixture
def ha_cluster(tmp_path):
    yield from cluster_factory(HaCluster, tmp_path)
