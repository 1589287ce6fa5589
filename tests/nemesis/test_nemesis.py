"""The nemesis suite (issue 27): real coordinators, reconnecting clients with ledgers, faults, a checker.

CI runs a short seed-fixed subset: the primary cut from its peers (not its clients) under Pacemaker and
under ZooKeeper, `ha.sync: all`. HAQUEUE_NEMESIS_FULL=1 runs every nemesis alone and a mixed plan
(HAQUEUE_NEMESIS_SEED, default 27, printed) under both coordinators and every sync mode plus the
`ha.min_confirmations: 1` opt-out; bench/nemesis.py runs mixed plans for N minutes.

Asserted: 0 lost (except under the opt-out, where the loss is printed, not judged), 0 unexpected,
duplicates within what was in flight (one publish per failed send, the consumer's credit per consumer
failure), and the cluster healthy again after each nemesis (the runner raises otherwise).
"""
from __future__ import annotations

import os
import random

import pytest

import disks
import nemeses
import runner
from pool import unavailable

pytestmark = pytest.mark.slow

FULL = bool(os.environ.get("HAQUEUE_NEMESIS_FULL"))
SEED = int(os.environ.get("HAQUEUE_NEMESIS_SEED", "27"))
OPT_OUT = ("all", 1)  # ha.min_confirmations: 1, the documented availability opt-out
MODES = [("all", None), ("all_disk", None), ("quorum_mem", None), ("quorum_disk", None), OPT_OUT]
# Past the +8.4 s at which Pacemaker's new primary takes the VIP (issue 27's timeline); ZooKeeper's session
# (3 s) expires and another broker is elected within about 4 s.
CI_HOLD = {"pacemaker": 12.0, "zookeeper": 8.0}


def _cases() -> list:
    ci = [pytest.param("pacemaker", "all", None, ["partition-primary"], id="pacemaker-all-partition-primary"),
          pytest.param("zookeeper", "all", None, ["partition-primary"], id="zookeeper-all-partition-primary")]
    if not FULL:
        return ci
    full = []
    for coordinator in ("pacemaker", "zookeeper"):
        for sync, floor in MODES:
            mode = sync if floor is None else f"{sync}-min{floor}"
            for name in [*nemeses.catalogue(3.0), "mixed"]:
                full.append(pytest.param(coordinator, sync, floor, [name], id=f"{coordinator}-{mode}-{name}"))
    return full


@pytest.mark.parametrize("coordinator,sync,floor,names", _cases())
def test_nemesis(nemesis_pool, tmp_path, coordinator, sync, floor, names):
    why = unavailable(coordinator)
    if why:
        pytest.skip(why)
    if "slow-disk" in names and disks.blkio_available():
        pytest.skip(disks.blkio_available())
    cluster = nemesis_pool.healthy(coordinator, sync, floor)
    if names == ["mixed"]:
        plan = nemeses.mixed(random.Random(SEED), 3, cluster.backup_timeout,
                             exclude=("slow-disk",) if disks.blkio_available() else ())
    else:
        plan = nemeses.plan(names, cluster.backup_timeout, CI_HOLD[coordinator])
    print(f"nemesis seed {SEED} (replay: HAQUEUE_NEMESIS_SEED={SEED})")
    outcome = runner.run(cluster, plan, SEED, tmp_path, queue=f"nemesis-{'-'.join(names)}")
    print("\n".join(outcome.events))
    if floor == 1:
        print(f"opt-out ha.min_confirmations: 1 lost {outcome.lost} (recorded, not judged)")
    else:
        assert outcome.lost == 0, f"confirmed messages lost: {outcome.line()}"
    assert outcome.unexpected == 0, outcome.line()
    assert outcome.duplicated <= outcome.duplicate_bound, outcome.line()
