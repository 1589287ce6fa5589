"""Fixtures for the ZooKeeper tests: a real 3-server ensemble and brokers using it, always cleaned up.

`ensemble`    a started `Ensemble` (zk_harness.py), serving. One ensemble serves the tests of every module of
              the run (three JVMs and an election, seconds each time; its ports are chosen free): every cluster
              has a ZooKeeper path of its own (ZkCluster's random path, the sharded tests' own), and an ensemble
              left serving holds nothing a later test reads. A test marked `breaks_ensemble` (it kills or stops
              servers) gets one of its own, killed at its end.
`zk_cluster`  ``zk_cluster(size=3, session_timeout=3.0, weights=None)`` makes a `ZkCluster` on that
              ensemble (not started); its brokers are SIGCONTed and stopped at the end, and the
              tails of every log are printed (pytest shows them when the test fails).
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ha_harness import cluster_factory  # noqa: E402
from zk_cluster import ZkCluster  # noqa: E402
from zk_harness import Ensemble, available  # noqa: E402


@contextlib.contextmanager
def _running(directory: Path) -> Iterator[Ensemble]:
    why = available()
    if why:
        pytest.skip(why)
    try:
        import kazoo  # noqa: F401
    except ImportError:
        pytest.skip("kazoo is not installed (pip install -e '.[zk]')")
    zk = Ensemble(directory)
    try:
        zk.start()
        yield zk
    finally:
        zk.stop()


@pytest.fixture(scope="session")
def shared_ensemble(tmp_path_factory) -> Iterator[Ensemble]:
    with _running(tmp_path_factory.mktemp("zookeeper")) as zk:
        yield zk


@pytest.fixture
def ensemble(request, tmp_path) -> Iterator[Ensemble]:
    with contextlib.ExitStack() as own:
        if request.node.get_closest_marker("breaks_ensemble"):
            zk = own.enter_context(_running(tmp_path / "zookeeper"))
        else:
            zk = request.getfixturevalue("shared_ensemble")
            zk.wait_serving()
        yield zk
        print(zk.log_tails())


@pytest.fixture
def zk_cluster(tmp_path, ensemble):
    yield from cluster_factory(functools.partial(ZkCluster, hosts=ensemble.hosts), tmp_path, fail_on_crash=False)
