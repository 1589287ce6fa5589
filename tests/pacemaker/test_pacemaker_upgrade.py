"""A rolling upgrade under Pacemaker, as packaging/README.md's "Upgrading" does it (design/upgrades.md): a
three-node cluster running the previous release, under load through the VIP, upgraded one node at a time
(`pcs node standby`, the new release installed, `pcs node unstandby`, the broker a ready backup again), the
primary's node last, once `pcs resource move` has moved the promoted role to an upgraded node; then the new
release's feature flag enabled. No confirmed message is lost; the client outage of each step is printed.

Each node runs haqueue from an install, as a package or a virtualenv puts one: the agent's `binary` is
/etc/haqueue/release/bin/haqueue on every node (each node's own /etc/haqueue), `release` a symlink to one of two
installs in the cluster's directory, and upgrading a node re-points it. The agent is this build's on every node
(the repository's agents/): the new agent runs the old release's brokers.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ha_harness import enable_new_features, features_enabled, upgrade_report
from harness import wait_for
from pcmk_clients import Load
from pcmk_cluster import CLONE, POLL_INTERVAL, REPO, VIP_ADDRESS, Node, PacemakerCluster, running
from releases import PREVIOUS

from haqueue import __version__

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the first run builds the previous release (minutes)

FEATURES = ["diverged-file-header", "mirror"]  # the feature flags of 0.2.0
RELEASE_LINK = Path("/etc/haqueue/release")  # on a node: the install it runs


def make_install(directory: Path, tree: Path) -> Path:
    """An install of the release whose compiled tree is `tree`, laid out as a virtualenv is: bin/python runs this
    virtualenv's Python with the tree first on its path, bin/haqueue is the haqueue command with bin/python on
    its #! line, which is also the Python the agent takes for its own requests (its `python` parameter unset)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tree} exec {sys.executable} "$@"\n')
    command = bin_dir / "haqueue"
    command.write_text(f"#!{python}\nimport sys\nfrom haqueue.cli import main\nsys.exit(main())\n")
    for f in (python, command):
        f.chmod(0o755)
    return directory


class UpgradableCluster(PacemakerCluster):
    """The test cluster with every node on the previous release to start with, ready to be upgraded node by node."""

    binary = RELEASE_LINK / "bin" / "haqueue"

    def __init__(self) -> None:
        super().__init__()
        self.installs = {release: make_install(self.base / "installs" / release, tree)
                         for release, tree in ((PREVIOUS.version, PREVIOUS.tree), (__version__, REPO))}

    def write_broker_configs(self, node: Node) -> None:
        super().write_broker_configs(node)
        self.install(node, PREVIOUS.version)

    def install(self, node: Node, release: str) -> None:
        """The node runs `release` from its broker's next start: its `release` link replaced at once, as a package
        manager replaces a file."""
        link = node.dir("etc-haqueue") / RELEASE_LINK.name
        staged = link.with_name("release.new")
        staged.unlink(missing_ok=True)
        staged.symlink_to(self.installs[release])
        os.replace(staged, link)

    def release(self, node: Node) -> str | None:
        """The release the node's broker runs, as its broker status says (every release's does)."""
        with self.admin(node) as client:
            code, _, body = client.request("READ", "broker")
        return body["version"] if code < 400 else None

    def upgrade(self, node: Node) -> None:
        """Standby, install, unstandby; back when every broker is healthy again, node's on the new release."""
        self.pcs("node", "standby", node.name)
        wait_for(lambda: not self.broker_pids_in(node), 60, interval=POLL_INTERVAL,
                 message=f"no broker on {node.name} in standby")
        self.install(node, __version__)
        self.pcs("node", "unstandby", node.name)
        self.wait_healthy(60)  # on an old primary, readiness is each backup's ha status: healthy() reads it
        assert self.release(node) == __version__


@pytest.fixture(scope="module")
def upgradable():
    PREVIOUS.build()
    yield from running(UpgradableCluster, lambda cluster: cluster.wait_healthy(90))


def test_rolling_upgrade_through_standby_and_move_loses_nothing(upgradable):
    c: UpgradableCluster = upgradable
    primary = c.wait_healthy(90)
    backups = [n for n in c.nodes if n is not primary]
    assert {n.name: c.release(n) for n in c.nodes} == {n.name: PREVIOUS.version for n in c.nodes}
    load = Load(VIP_ADDRESS, "upgrade")
    load.heartbeat = 2.0
    load.start()
    outages = {}
    try:
        load.wait_confirmed(200, 30)
        for node in backups:
            outages[f"upgrade {node.name}"] = load.step(lambda: c.upgrade(node))
        refused = c.cli(primary, "cluster", "upgrade-check", check=False)  # the previous release answers it not
        assert refused.returncode == 1 and "unknown operation READ on type upgrade-check" in refused.stderr, refused

        new = backups[0]
        outages[f"move to {new.name}"] = load.step(
            lambda: c.pcs("resource", "move", CLONE, new.name, "--promoted", "--wait=60", timeout=120))
        c.pcs("resource", "clear", CLONE)
        assert c.wait_healthy(60) is new
        check = json.loads(c.cli(new, "cluster", "upgrade-check").stdout)
        assert check["ok"] and check["members"][primary.name]["release"] == PREVIOUS.version, check
        assert check["features_to_enable"] == [], check  # not while a member runs the previous release

        outages[f"upgrade {primary.name}"] = load.step(lambda: c.upgrade(primary))
        assert c.primary_node() is new
        enable_new_features(lambda *args: c.cli(new, *args, check=False), FEATURES)
        for node in c.nodes:
            wait_for(lambda: features_enabled(node.dir("lib-haqueue")) == FEATURES, 10,
                     message=f"{node.name} knowing {FEATURES} are enabled")
        load.wait_confirmed(200, 30)
    finally:
        load.stop()
    upgrade_report(load, outages, "Pacemaker")
