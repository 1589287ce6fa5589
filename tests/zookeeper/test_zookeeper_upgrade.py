"""A rolling upgrade of a cluster coordinated by ZooKeeper, as packaging/README.md's "Upgrading" does it
(design/upgrades.md): three brokers of the previous release, under load, each stopped and started again on this
build in turn until it is a ready backup again, the primary last (its stop moves the election to an upgraded
backup); then the new release's feature flag enabled. No confirmed message is lost; the client outage of each step
is printed."""
from __future__ import annotations

from pathlib import Path

import pytest

from ha_harness import enable_new_features, features_enabled, upgrade_report
from harness import BrokerProcess, wait_for
from releases import PREVIOUS
from zk_cluster import Load, ZkCluster

from haqueue import __version__

FEATURES = ["diverged-file-header", "mirror"]  # the feature flags of 0.2.0


def release(c: ZkCluster, b: BrokerProcess) -> str:
    return c.request(b, "READ", "broker")["version"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first run builds the previous release (minutes)
def test_rolling_upgrade_under_zookeeper_loses_nothing(zk_cluster):
    PREVIOUS.build()
    c: ZkCluster = zk_cluster()
    for b in c:
        PREVIOUS.run(b)
    c.start()
    primary = c.wait_primary()
    c.wait_ready_backups(primary)
    assert {b.name: release(c, b) for b in c} == {b.name: PREVIOUS.version for b in c}
    load = Load(c.addresses, "upgrade").start()
    outages = {}

    def upgrade(b: BrokerProcess) -> None:
        nonlocal primary
        b.stop()  # SIGTERM; the primary's ends its ZooKeeper session: the ready backups elect one of them
        if b is primary:
            primary = c.wait_primary(timeout=c.session_timeout + 10, exclude=(b,))
        b.env = None  # this build from its next start
        b.start()
        c.wait_ready(b, timeout=30, queues=["upgrade"])
        assert release(c, b) == __version__
    try:
        load.wait_confirmed(200, 30)
        for b in [b for b in c if b is not primary] + [primary]:  # the backups one at a time, the primary last
            outages[b.name] = load.step(lambda: upgrade(b))
        enable_new_features(lambda *args: c.cli(primary, *args), FEATURES)
        for b in c:
            wait_for(lambda: features_enabled(Path(b.config["data_dir"])) == FEATURES, 10,
                     message=f"{b.name} knowing {FEATURES} are enabled")
        load.wait_confirmed(200, 30)
        load.drain()
    finally:
        load.stop()
    upgrade_report(load, outages, "ZooKeeper")
