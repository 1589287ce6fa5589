"""Clusters that mix this build with the previous release (design/upgrades.md): each follows the other's primary
on the protocol both speak, a failover between them keeps every message; a peer is refused when the two share
no protocol, or when it lacks a feature its cluster has enabled. The rolling upgrades under load are
test_cluster_up_upgrade.py's, and the Pacemaker and ZooKeeper suites'."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ha_harness import HaCluster, features_enabled, send_all
from harness import BrokerProcess, wait_for
from haqueue import __version__
from haqueue.ha.protocol import OLDEST_PROTOCOL, PROTOCOL

FEATURES = ["diverged-file-header", "mirror"]  # the feature flags of 0.2.0
FEATURE = FEATURES[0]

pytestmark = pytest.mark.usefixtures("previous")


def backup_view(c: HaCluster, primary: BrokerProcess) -> dict[str, dict[str, Any]]:
    """The primary's view of each backup, by name (this build's ha status)."""
    return {b["name"]: b for b in c.status(primary)["backups"]}


def fail_over(c: HaCluster, old: BrokerProcess) -> BrokerProcess:
    """Kill -9 the primary and promote the best ready backup."""
    c.kill(old)
    new = wait_for(lambda: c.best_backup(exclude=[old]), 15, message="a ready backup")
    c.promote(new)
    return new


def test_each_release_follows_the_others_primary_and_keeps_every_message(ha_cluster, previous):
    c: HaCluster = ha_cluster()
    previous.run(c[0])  # the previous release as primary, this build's backups
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "q")
    send_all(c.public, "q", range(200))
    for b in c.brokers[1:]:
        c.wait_ready(b, queues=["q"])
        c.wait_depth(b, "q", 200)
        status = c.status(b)
        assert status["protocol"] == 1 and status["primary_build"]["release"] == "0.1.0", status

    new = fail_over(c, p)
    c.wait_state(new, "primary", "active")
    assert c.bodies(new, "q") == list(range(200))
    c.start(0)  # the old primary comes back, still the previous release, as a backup of this build
    c.wait_ready(c[0], queues=["q"])
    send_all(c.public, "q", range(200, 300))
    c.wait_depth(c[0], "q", 300)
    assert c.bodies(c[0], "q") == list(range(300))
    view = backup_view(c, new)
    assert view["b0"]["release"] == "0.1.0" and view["b0"]["protocol"] == 1, view
    assert view[c[2].name]["release"] == __version__ and view[c[2].name]["protocol"] == PROTOCOL, view
    refused = c.cli(new, "cluster", "features", "enable", FEATURE)  # b0 could not read what it would write
    assert refused.returncode == 1 and f"cannot enable {FEATURE}: b0 (0.1.0) does not support it" in refused.stderr

    c.kill(new)
    c.promote(c[0])  # the previous release takes over this build's stream
    c.wait_state(c[0], "primary")
    assert c.bodies(c[0], "q") == list(range(300))


def test_a_peer_sharing_no_protocol_is_refused_on_both_sides(ha_cluster):
    """b0 and b1 stand for a future release (protocols 3-5, by a test hook); b2, this build, speaks 1-2: the
    primary refuses it at open and it refuses the primary, both saying which broker to upgrade, and b2 follows
    nothing while the others go on."""
    c: HaCluster = ha_cluster()
    for b in c.brokers[:2]:
        b.env = {"HAQUEUE_TEST_PROTOCOLS": "3-5"}
    c.start(0, 1)
    p = c[0]
    c.promote(p)
    c.wait_ready(c[1])
    c.request(p, "CREATE", "queue", "q")
    send_all(c.public, "q", range(10))  # confirmed by b0 and b1, a majority
    c.start(2)
    expected = f"b2 ({__version__}) speaks replication protocol {OLDEST_PROTOCOL}-{PROTOCOL}, primary b0 " \
               f"({__version__}) speaks 3-5: upgrade b2"
    wait_for(lambda: c.status(p)["protocol_refusals"].get("b2") == expected, 10,
             message=f"b0 refusing b2 ({c.status(p)['protocol_refusals']})")
    wait_for(lambda: c.status(c[2])["protocol_refusals"].get("b0") == expected, 10,
             message=f"b2 refused by b0 ({c.status(c[2])['protocol_refusals']})")
    status = c.status(c[2])
    assert status["state"] == "joining" and status["primary"] is None, status
    assert "q" not in c.queues(c[2])
    assert expected in p.log() and expected in c[2].log()
    assert [b["name"] for b in c.status(p)["backups"]] == ["b1"]
    send_all(c.public, "q", range(10, 20))
    c.wait_depth(c[1], "q", 20)


def test_a_new_cluster_starts_with_every_feature_and_refuses_a_member_without_it(ha_cluster, previous):
    c: HaCluster = ha_cluster()
    previous.run(c[2])
    c.start(0, 1)
    p = c[0]
    c.promote(p)
    c.wait_ready(c[1])
    features = json.loads(c.cli(p, "cluster", "features").stdout)
    assert [(f["name"], f["enabled"]) for f in features["features"]] == [(name, True) for name in FEATURES], features
    assert features["features"][0]["supported_by"] == {"b0": True, "b1": True} and features["members_absent"] == 1
    assert features_enabled(Path(c[1].config["data_dir"])) == FEATURES
    c.start(2)
    expected = f"backup b2 (0.1.0) lacks feature {', '.join(FEATURES)}, enabled in this cluster: upgrade b2"
    wait_for(lambda: c.status(p)["protocol_refusals"].get("b2") == expected, 10,
             message=f"b0 refusing b2 ({c.status(p)['protocol_refusals']})")
    check = c.cli(p, "cluster", "upgrade-check")
    assert check.returncode == 1 and f"refused peer: {expected}" in check.stderr, check
    assert c.status(c[2])["state"] == "joining"
