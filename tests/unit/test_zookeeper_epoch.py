"""A broker's own election claim, seen back through ZooKeeper's epoch watch, is not news of another
primary: a brand-new winner stays eligible (the race made a first election loop forever)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("kazoo")
from haqueue.coord.zookeeper import ZooKeeperCoordinator  # noqa: E402
from haqueue.ha.role import BACKUP, EpochStore  # noqa: E402


def coordinator(tmp_path, claiming):
    c = object.__new__(ZooKeeperCoordinator)  # the loop-side logic only: no ZooKeeper session
    epoch = EpochStore(str(tmp_path))
    c.ha = SimpleNamespace(role=BACKUP, epoch=epoch, raise_epoch=epoch.raise_to)
    c.worker = SimpleNamespace(claiming=claiming)
    return c


def test_own_claim_does_not_mark_a_brand_new_broker(tmp_path):
    c = coordinator(tmp_path, claiming=1)
    c.epoch_seen(1)
    assert (c.ha.epoch.epoch, c.ha.epoch.had_primary) == (0, False)


def test_another_brokers_epoch_is_recorded(tmp_path):
    c = coordinator(tmp_path, claiming=None)
    c.epoch_seen(3)
    assert (c.ha.epoch.epoch, c.ha.epoch.had_primary) == (3, True)


def test_an_election_seen_go_by_leaves_the_stores_freshness(tmp_path):
    """Another broker's win (even one it then resigns) raises the epoch a backup refuses primaries
    below, not what its store holds: after a total outage the freshest store still outranks it (the
    race made a resigned win erase every standing, and a staler store was elected)."""
    c = coordinator(tmp_path, claiming=None)
    c.ha.epoch.hold(4)
    c.ha.epoch.stand(2)
    c.epoch_seen(5)
    reloaded = EpochStore(str(tmp_path))
    assert (reloaded.epoch, reloaded.held, reloaded.standing) == (5, 4, 2)
    reloaded.hold(5)  # it follows the new primary: it holds nothing of epoch 5 yet
    assert (reloaded.held, reloaded.standing) == (5, 0)
