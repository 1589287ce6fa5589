"""Fixtures for the HA tests: clusters of real broker processes, always cleaned up.

`ha_cluster`  ``ha_cluster(size=3, backup_timeout=2, replicate=None, extra=None)`` makes an
              `HaCluster` (not started); every broker it made is SIGCONTed and stopped at the
              end of the test, and the tails of their logs are printed (pytest shows them when
              the test fails). A broker that exited without the test asking fails the test.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ha_harness import HaCluster  # noqa: E402


@pytest.fixture
def ha_cluster(tmp_path):
    made: list[HaCluster] = []

    def make(size: int = 3, **kw) -> HaCluster:
        cluster = HaCluster(tmp_path / f"cluster{len(made)}", size=size, **kw)
        made.append(cluster)
        return cluster

    yield make
    crashed = []
    for cluster in made:
        for b in cluster.brokers:
            if b.proc is not None and b.proc.poll() is not None and not b.exit_expected:
                crashed.append(f"{b.name} exited with {b.proc.returncode} during the test")
        cluster.shutdown()
        print(cluster.log_tails(80))
    if crashed:
        pytest.fail("; ".join(crashed), pytrace=False)
