"""Fixtures for the audit tests.

`spark`       one local Spark session for the whole test run (starting one costs 7-12 s); None of the
              Spark tests run without PySpark installed (the `spark` extra): they are skipped.
`event_dir`   a fresh directory for an event set.
`ha_cluster`  HA clusters of real brokers (tests/ha/ha_harness.py), stopped at the end of the test.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "ha"))


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    from haqueue.audit import sources

    session = sources.session("local[2]")
    yield session
    session.stop()


@pytest.fixture
def event_dir(tmp_path: Path) -> Path:
    return tmp_path / "events"


@pytest.fixture
def ha_cluster(tmp_path):
    from ha_harness import HaCluster

    made: list[HaCluster] = []

    def make(size: int = 3, **kw) -> HaCluster:
        cluster = HaCluster(tmp_path / f"cluster{len(made)}", size=size, **kw)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.shutdown()
        print(cluster.log_tails(60))
