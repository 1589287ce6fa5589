"""Fixtures for the audit tests.

`spark`       the local Spark session: one JVM for the whole test run (starting one costs 7-12 s, and a cold
              JVM's first audit twice a warm one's). An audit command run in this process
              (audit_command.run_audit_command) stops its session at its end; the next test gets a new one
              in the same JVM. None of the Spark tests run without PySpark installed (the `spark` extra):
              they are skipped.
`local_spark` the same for module- and session-scoped fixtures: a function returning the session.
`event_dir`   a fresh directory for an event set.
`scenario_dir`     eventsets.failover_scenario written once for the run, and `failover_audit` its audit
                   (lag.analyse), once: test_lag checks its figures (an audit of it is some 15 s; the tests that
                   change the set copy it first).
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
def local_spark():
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from haqueue.audit import sources

    yield lambda: sources.session("local[2]")  # the running session, else a new one (in the same JVM)
    running = SparkSession.getActiveSession()
    if running is not None:
        running.stop()


@pytest.fixture
def spark(local_spark):
    return local_spark()


@pytest.fixture
def event_dir(tmp_path: Path) -> Path:
    return tmp_path / "events"


@pytest.fixture(scope="session")
def scenario_dir(tmp_path_factory) -> Path:
    from eventsets import failover_scenario

    return failover_scenario().write(tmp_path_factory.mktemp("scenario") / "events")


@pytest.fixture(scope="session")
def failover_audit(local_spark, scenario_dir):
    from haqueue.audit import lag

    return lag.analyse(local_spark(), str(scenario_dir))


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
