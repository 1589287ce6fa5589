"""Fixtures for the Pacemaker tests.

`pcmk_cluster`  one real three-node Corosync/Pacemaker cluster (pcmk_cluster.py) for the whole
                module, built on first use and always torn down (namespaces, bridge, processes,
                mount points). Skipped, with the reason, when not root or when this machine
                cannot make network namespaces. Its brokers mirror the `orders.*` queues to `standby`
                (pcmk_mirror.py), so that the mirror's test shares the module's cluster (a build is
                10-30 s) with the others, whose queues are not mirrored.
`standby`       the mirror's standby: one broker in the root namespace, for the module.
`sharded_pcmk_cluster`  the same three nodes running 2 shards (pcmk_shards.py), built for the module
                once every shard is promoted on its preferred node.
`cluster`       the same cluster, restored to healthy before the test: link up, no move/ban
                constraint, failures cleaned up, one active primary holding the VIP and two
                ready backups.

HAQUEUE_PCMK_KEEP=1 keeps the nodes' files (logs, CIBs) after the run, for a post-mortem.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BrokerProcess, unexpected_exits  # noqa: E402
from pcmk_cluster import running  # noqa: E402
from pcmk_mirror import MirroredCluster, standby_config  # noqa: E402
from pcmk_shards import ShardedPacemakerCluster  # noqa: E402


@pytest.fixture(scope="module")
def standby(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("standby"), standby_config(), name="standby").start()
    yield broker
    crashed = unexpected_exits([broker])
    broker.stop()
    print(broker.log()[-4000:])
    assert not crashed, crashed


@pytest.fixture(scope="module")
def pcmk_cluster(standby):
    yield from running(lambda: MirroredCluster(standby.address), lambda cluster: cluster.wait_healthy(90))


@pytest.fixture(scope="module")
def sharded_pcmk_cluster():
    yield from running(ShardedPacemakerCluster, lambda cluster: cluster.wait_preferred_primaries(120))


@pytest.fixture
def cluster(pcmk_cluster, request):
    pcmk_cluster.restore()
    yield pcmk_cluster
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(pcmk_cluster.describe())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
