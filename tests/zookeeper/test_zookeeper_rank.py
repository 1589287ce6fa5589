"""The election's choices from member data alone (no ZooKeeper): who the candidates are, best first
(`rank`), and when a candidate contends after a total outage (`_Worker._elect`). Fast."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("kazoo")
from haqueue.coord.zookeeper import _Worker, rank  # noqa: E402


def member(state: str = "joining", role: str = "backup", freshness=(0, 0, 0), had_primary: bool = True,
           weight: int = 0, applied: int = 0, eligible: bool = True) -> dict:
    return {"role": role, "state": state, "freshness": list(freshness), "epoch": freshness[0],
            "had_primary": had_primary, "weight": weight, "applied": applied, "eligible": eligible}


# After a total outage: b0 was epoch 4's primary, b1 a ready backup of it, b2 dropped out earlier.
OUTAGE = {"b0": member(freshness=(4, 2, 160)), "b1": member(freshness=(4, 1, 150)),
          "b2": member(freshness=(4, 1, 100), weight=100)}


def test_total_outage_the_freshest_store_is_the_only_candidate():
    assert rank(OUTAGE, zk_epoch=4) == ["b0"]
    # without b0, b1: a higher weight does not beat a fresher store
    assert rank({n: m for n, m in OUTAGE.items() if n != "b0"}, zk_epoch=4) == ["b1"]


def test_total_outage_equally_fresh_stores_rank_by_weight_then_name():
    members = {"b0": member(freshness=(4, 1, 150)), "b1": member(freshness=(4, 1, 150), weight=5),
               "b2": member(freshness=(4, 1, 150)), "b3": member(freshness=(3, 2, 900))}
    assert rank(members, zk_epoch=4) == ["b1", "b0", "b2"]


def test_a_blank_broker_joining_a_cluster_that_had_a_primary_is_no_new_cluster():
    """ZooKeeper's epoch says an election happened: a broker whose data dir is empty is not brand new."""
    members = {"b0": member(had_primary=False), "b1": member(freshness=(4, 0, 10), had_primary=True)}
    assert rank(members, zk_epoch=4) == ["b1"]
    assert rank({"b0": member(had_primary=False)}, zk_epoch=0) == ["b0"]  # a brand-new cluster
    assert rank({"b0": member(had_primary=False), "b1": member(had_primary=False, weight=1)},
                zk_epoch=0) == ["b1", "b0"]


def test_a_ready_backup_beats_every_joining_one_and_a_catching_up_one_blocks_the_restart_rule():
    members = dict(OUTAGE, b3=member(state="ready", freshness=(4, 1, 120)))
    assert rank(members, zk_epoch=4) == ["b3"]
    members = dict(OUTAGE, b3=member(state="catchup", freshness=(4, 0, 120)))
    assert rank(members, zk_epoch=4) == []  # it follows a primary: not a total outage
    members = dict(OUTAGE, b3=member(role="primary", state="active", freshness=(4, 2, 200)))
    assert rank(members, zk_epoch=4) == []


class Contended(Exception):
    pass


def worker(name: str, members: dict, no_primary_for: float, recovery_wait: float = 10.0,
           cluster_size: int = 3) -> _Worker:
    w = object.__new__(_Worker)  # the election's decision only: no session, no thread
    w.name, w.zk_epoch, w.cluster_size, w.recovery_wait = name, 4, cluster_size, recovery_wait
    w.members = {n: m for n, m in members.items() if n != name}
    w._desired = members[name]
    w._no_primary_since = time.monotonic() - no_primary_for

    def contend() -> None:
        raise Contended(name)
    w._contend = contend
    return w


def contends(w: _Worker) -> bool:
    try:
        w._elect()
    except Contended:
        return True
    return False


def test_after_a_total_outage_the_freshest_present_waits_for_the_missing_until_recovery_wait():
    present = {n: m for n, m in OUTAGE.items() if n != "b0"}  # b0, the freshest, is not back yet
    assert not contends(worker("b1", present, no_primary_for=2.0))
    assert contends(worker("b1", present, no_primary_for=10.5))
    assert not contends(worker("b2", present, no_primary_for=60.0))  # staler than b1, which is present


def test_after_a_total_outage_the_freshest_contends_at_once_when_every_broker_is_back_and_eligible():
    assert contends(worker("b0", OUTAGE, no_primary_for=0.0))
    assert not any(contends(worker(n, OUTAGE, no_primary_for=60.0)) for n in ("b1", "b2"))
    # not yet eligible (it has not met every peer): it does not contend, and no one else does
    waiting = dict(OUTAGE, b0=member(freshness=(4, 2, 160), eligible=False))
    assert not any(contends(worker(n, waiting, no_primary_for=60.0)) for n in waiting)
