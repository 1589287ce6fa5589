"""Fixtures for the ZooKeeper tests: a real 3-server ensemble and brokers using it, always cleaned up.

`ensemble`    a started `Ensemble` (zk_harness.py), killed at the end of the test.
`zk_cluster`  ``zk_cluster(size=3, session_timeout=3.0, weights=None)`` makes a `ZkCluster` on that
              ensemble (not started); its brokers are SIGCONTed and stopped at the end, and the
              tails of every log are printed (pytest shows them when the test fails).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ha_harness import cluster_factory  # noqa: E402
from zk_cluster import ZkCluster  # noqa: E402
from zk_harness import Ensemble, available  # noqa: E402


@pytest.fixture
def ensemble(tmp_path):
    why = available()
    if why:
        pytest.skip(why)
    try:
        import kazoo  # noqa: F401
    except ImportError:
        pytest.skip("kazoo is not installed (pip install -e '.[zk]')")
    zk = Ensemble(tmp_path / "zookeeper")
    try:
        zk.start()
        yield zk
    finally:
        zk.stop()
        print(zk.log_tails())


@pytest.fixture
def zk_cluster(tmp_path, ensemble):
    yield from cluster_factory(functools.partial(ZkCluster, hosts=ensemble.hosts), tmp_path, fail_on_crash=False)
