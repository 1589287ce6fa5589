"""The election's choices from member data alone (no ZooKeeper): who the candidates are, best first
(`rank`), and when a candidate contends after a total outage (`_Worker._elect`). Fast."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

pytest.importorskip("kazoo")
from haqueue.coord.zookeeper import _Worker, rank  # noqa: E402


def member(state: str = "joining", role: str = "backup", freshness=(0, 0, 0), had_primary: bool = True,
           weight: int = 0, applied: int = 0, eligible: bool = True, preferred: bool = False) -> dict:
    return {"role": role, "state": state, "freshness": list(freshness), "epoch": freshness[0],
            "had_primary": had_primary, "weight": weight, "applied": applied, "eligible": eligible,
            "preferred": preferred}


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


def test_a_ready_preferred_member_comes_first_among_ready_backups_whatever_it_applied():
    """Under sync all every ready backup holds every confirmed message: the preferred one (back from a
    restart, so with fewer transfers applied) is first; the others keep the applied, weight, name order."""
    members = {"b0": member(state="ready", applied=10, preferred=True), "b1": member(state="ready", applied=900),
               "b2": member(state="ready", applied=500, weight=9)}
    assert rank(members, zk_epoch=4) == ["b0", "b1", "b2"]
    assert rank(dict(members, b0=member(state="catchup", preferred=True)), zk_epoch=4) == ["b1", "b2"]
    assert rank(dict(members, b0=member(state="joining", preferred=True)), zk_epoch=4) == ["b1", "b2"]


def test_a_preferred_member_never_beats_a_fresher_store_after_a_total_outage():
    members = dict(OUTAGE, b1=member(freshness=(4, 1, 150), preferred=True))
    assert rank(members, zk_epoch=4) == ["b0"]
    equal = {"b0": member(freshness=(4, 1, 150), weight=5), "b1": member(freshness=(4, 1, 150), preferred=True),
             "b2": member(freshness=(4, 0, 150), preferred=True)}
    assert rank(equal, zk_epoch=4) == ["b1", "b0"]  # equally fresh: the preferred first, before weight


def test_a_brand_new_cluster_elects_its_preferred_member_first():
    members = {"b0": member(had_primary=False, weight=3), "b1": member(had_primary=False, preferred=True)}
    assert rank(members, zk_epoch=0) == ["b1", "b0"]


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


def leader(name: str, members: dict, failback_delay: float) -> tuple[_Worker, list[str]]:
    """A primary's worker deciding on failback from member data alone; returns the names it resigned to."""
    w = object.__new__(_Worker)
    w.members = {n: m for n, m in members.items() if n != name}
    w._desired = members[name]
    w._leader_session, w._preferred_ready_since, w._failing_back = 1, None, False
    resigned: list[str] = []
    w.coordinator = SimpleNamespace(config=SimpleNamespace(failback_delay=failback_delay),
                                    call=lambda fn: fn(), fail_back=resigned.append)
    return w, resigned


def test_a_primary_resigns_once_the_preferred_member_has_been_ready_for_failback_delay():
    members = {"b1": member(role="primary", state="active"), "b0": member(state="ready", preferred=True),
               "b2": member(state="ready")}
    w, resigned = leader("b1", members, failback_delay=30)
    w._fail_back_when_due()
    assert resigned == [] and w._preferred_ready_since is not None
    w._preferred_ready_since -= 29.5
    w._fail_back_when_due()
    assert resigned == []
    w.members["b0"] = member(state="catchup", preferred=True)  # not continuously ready: the wait starts again
    w._fail_back_when_due()
    assert w._preferred_ready_since is None
    w.members["b0"] = member(state="ready", preferred=True)
    w._fail_back_when_due()
    w._preferred_ready_since -= 30
    w._fail_back_when_due()
    w._fail_back_when_due()
    assert resigned == ["b0"]  # once


def test_failback_delay_zero_or_a_preferred_primary_keeps_the_primary():
    members = {"b1": member(role="primary", state="active"), "b0": member(state="ready", preferred=True)}
    w, resigned = leader("b1", members, failback_delay=0)
    w._fail_back_when_due()
    assert resigned == [] and w._preferred_ready_since is None
    members = {"b1": member(role="primary", state="active", preferred=True), "b0": member(state="ready", preferred=True)}
    w, resigned = leader("b1", members, failback_delay=1)
    w._fail_back_when_due()
    assert resigned == [] and w._preferred_ready_since is None
