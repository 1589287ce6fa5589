"""Shared pytest fixtures: real broker processes on free loopback ports.

`broker`          one broker with the default config, started for the test, stopped after it.
`broker_factory`  ``broker_factory(**config)`` starts a broker with that config (keys as in the
                  YAML file, see design/management.md); ``broker_factory(config_dict, name=...)``
                  works too. Every broker it started is stopped after the test.

A broker that exits while the test runs, without the test asking for it, fails the test at
teardown (a crash is a bug). The broker's log is printed at teardown, so pytest shows it with
any failing test.

The tests and every process they start read no system CA bundle (SSL_CERT_FILE, below): it cost every proton client
110 ms of CPU, and no test trusts the system's CAs.

Every Spark JVM the tests start (the audit's, in the tests' process or in the commands they run) runs
with spark_archive.jvm_options(), Spark's class archive among them once tests/spark_archive.py made it, unless
PYSPARK_SUBMIT_ARGS is already set.

Every test of a directory in CLUSTER_SUITES is marked `slow`: they run several broker processes, a
ZooKeeper ensemble, Pacemaker or Spark, seconds each, so `pytest -m "not slow"` (`make quick`) keeps
the unit tests and the single-broker ones, the subset to run while working.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`), a module's tests on
one worker in order (some share a module-scoped broker and build on each other). Two groups of
directories (GROUPS, with the exceptions of MODULE_GROUPS) each run on one worker, one test after another:
Pacemaker's network namespaces and ZooKeeper's ensembles have fixed names and ports and the nemesis suite times
partitions (`coordination`); the Spark tests share one JVM (`spark`). The two are the longest units of work, 10-15 minutes each, so
they are handed out first, one to each worker (xdist's own order, by number of tests, would start one
of them late); the other modules fill in around them (ports are chosen free at run time, directories
are per test), tests/unit's last: a worker that ends early takes its short modules, not a long one the
other worker would wait for.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Every proton Container (each client connection a test opens in its process, each `haqueue admin` it runs) makes
# two SSL contexts, and OpenSSL reads the system's CA bundle into each: 55 ms of CPU apiece, which was half the CPU
# of tests/ha/test_ha_basic.py. No test trusts the system's CAs (every TLS test names its own CA file), so the tests
# and the processes they start read an empty bundle, whatever the environment names (many set SSL_CERT_FILE).
os.environ["SSL_CERT_FILE"] = os.devnull

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS), str(TESTS / "ha")]  # harness.py; ha_harness.py (clusters, clients) for every suite

from harness import BrokerProcess, unexpected_exits  # noqa: E402
from releases import PREVIOUS  # noqa: E402
from spark_archive import jvm_options  # noqa: E402

LOG_TAIL_LINES = 150
CLUSTER_SUITES = ("audit", "console", "ha", "mirror", "nemesis", "pacemaker", "shard", "upgrade", "zookeeper")
GROUPS = {"audit": "spark", "nemesis": "coordination", "pacemaker": "coordination", "zookeeper": "coordination"}
# Modules whose group is not their directory's: a sharded run audited in this process (`haqueue audit lag`), with
# the Spark tests, whose JVM is then warm (alone on another worker it started a JVM of its own: 20-30 s of a
# core); and the Pacemaker tests that need no cluster (the agent on loopback, pcs on a CIB file: no namespace,
# no fixed port), each a module of its own rather than part of the longest group.
MODULE_GROUPS = {"shard/test_shard_audit.py": "spark", "pacemaker/test_pacemaker_agent.py": None,
                 "pacemaker/test_pcs_shard_setup.py": None}
FIRST = ("spark", "coordination")  # handed out first, in this order
LAST = "unit"  # the directory handed out last: its many short modules even out the workers' ends


def pytest_configure(config: pytest.Config) -> None:
    config.option.loadscopereorder = False  # xdist hands the groups out in the items' order (below)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups: dict[str, str] = {}  # nodeid -> its xdist group
    for item in items:
        path = Path(item.fspath).relative_to(TESTS)
        if path.parts[0] in CLUSTER_SUITES:
            item.add_marker(pytest.mark.slow)
        # a module's tests stay together, in order: some share a module-scoped broker and build on each other
        groups[item.nodeid] = _group(path)
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: _handed_out(groups[item.nodeid], Path(item.fspath).relative_to(TESTS)))


def _handed_out(group: str, path: Path) -> int:
    """Where a group's tests go in the order xdist hands the groups out in."""
    if group in FIRST:
        return FIRST.index(group)
    return len(FIRST) + (path.parts[0] == LAST)


def _group(path: Path) -> str:
    """The xdist group of the tests of a module (its path under tests/)."""
    module = path.as_posix()
    if module in MODULE_GROUPS:
        return MODULE_GROUPS[module] or module
    return GROUPS.get(path.parts[0], module)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The upgrade tests run the previous release (releases.py): its build starts with the run, if any of them is
    to run once -m and -k have deselected (`make quick` runs none, and a build is minutes of a core)."""
    if any(_runs_previous_release(item) for item in session.items):
        PREVIOUS.build_soon()


def _runs_previous_release(item: pytest.Item) -> bool:
    """tests/upgrade's tests, and those of a module that imports PREVIOUS (not every test named "upgrade")."""
    module = getattr(item, "module", None)
    return Path(item.fspath).relative_to(TESTS).parts[0] == "upgrade" or getattr(module, "PREVIOUS", None) is PREVIOUS


def _log_tail(broker: BrokerProcess) -> str:
    lines = broker.log().splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _finish(brokers: list[BrokerProcess]) -> None:
    crashed = unexpected_exits(brokers)
    for b in brokers:
        b.stop()
        print(f"\n==== log of broker {b.name} ({b.log_path}), last {LOG_TAIL_LINES} lines ====")
        print(_log_tail(b))
    if crashed:
        pytest.fail("; ".join(crashed), pytrace=False)


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers from config dicts; all are stopped at the end of the test."""
    started: list[BrokerProcess] = []

    def make(config: dict | None = None, *, name: str | None = None, start: bool = True,
             **config_kw) -> BrokerProcess:
        cfg = dict(config or {})
        cfg.update(config_kw)
        bname = name or cfg.get("name") or f"b{len(started)}"
        b = BrokerProcess(tmp_path / bname, cfg, name=bname, port_retries=3)
        started.append(b)
        if start:
            b.start()
        return b

    yield make
    _finish(started)


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """One broker with the default config on a free loopback port."""
    return broker_factory()


@pytest.fixture(scope="session", autouse=True)
def small_spark_jobs():
    """PySpark launches its JVM with PYSPARK_SUBMIT_ARGS, here and in the processes the tests start."""
    with pytest.MonkeyPatch.context() as patch:
        if "PYSPARK_SUBMIT_ARGS" not in os.environ:
            patch.setenv("PYSPARK_SUBMIT_ARGS", f'--driver-java-options "{jvm_options()}" pyspark-shell')
        yield
