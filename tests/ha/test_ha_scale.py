"""Thousands of replicated durable queues on a 3-broker cluster (issue 26): every backup holds every queue
before it says `ready`, every confirmed message is on all three brokers, and the cluster survives kill -9 of
its primary and of every broker at once with all of them.

At 3,000 queues this once went wrong five ways at once: replication stopped at 998 queues (the peer
connection's link limit) while the backups still said `ready`, both backups were dropped on the first
publish (a guard's clock ran from the queue's declaration), the primary could not answer a QUERY, and a
failover found no ready backup and refused the old primary for good."""
from __future__ import annotations

import pytest

from ha_harness import HaCluster, OPS_USER
from harness import wait_for
from many_queues import declare_queues, fill_queues

QUEUES = 3000
PER_QUEUE = 10
NAMES = [f"s-{i:05d}" for i in range(QUEUES)]


def depths(c: HaCluster, b) -> dict[str, int]:
    return {name: q["depth"] for name, q in c.queues(b).items() if name.startswith("s-")}


def assert_all_hold(c: HaCluster, brokers, expected: dict[str, int]) -> None:
    for b in brokers:
        held = depths(c, b)
        wrong = {name: held.get(name) for name in NAMES if held.get(name) != expected[name]}
        assert not wrong, f"{b.name}: {len(wrong)} queues differ, e.g. {dict(list(wrong.items())[:5])}"


def wait_all_ready(c: HaCluster, backups, timeout: float = 60.0) -> None:
    for b in backups:
        c.wait_state(b, "backup", "ready", timeout, check=lambda s: s["replicating"] == {
            "queues": QUEUES, "caught_up": QUEUES, "waiting": 0, "refused": 0})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_thousand_queues_replicate_fail_over_and_come_back_whole(ha_cluster):
    c = ha_cluster(backup_timeout=5.0)
    p = c.start_cluster()
    declare_queues(p.address, NAMES, {"durable": True}, window=500, timeout=120, user=OPS_USER, password=c.password)
    backups = [b for b in c if b is not p]
    wait_all_ready(c, backups)
    accepted = fill_queues(c.public, [(name, f"{name}/{k}") for k in range(PER_QUEUE) for name in NAMES], 120)
    assert accepted == QUEUES * PER_QUEUE
    expected = {name: PER_QUEUE for name in NAMES}
    for b in c:
        status = c.status(b)
        assert status.get("timeout_drops", 0) == 0 and all(x["timeout_drops"] == 0 for x in status.get("backups", []))
    assert_all_hold(c, c, expected)

    # kill -9 of the primary: a ready backup takes over and confirms at once; the old one comes back ready
    c.kill(p)
    new = c.best_backup()
    assert new is not None
    c.promote(new)
    assert fill_queues(c.public, [(NAMES[0], "after failover")], 10) == 1
    expected[NAMES[0]] += 1
    c.start(c.brokers.index(p))
    wait_all_ready(c, [b for b in c if b is not new])
    assert_all_hold(c, c, expected)

    # every broker killed at once: the freshest store is promoted and everything is back on all three
    for b in c:
        c.kill(b)
    c.start()
    wait_for(lambda: any(c.cli(b, "ha", "promote").returncode == 0 for b in c), 60,
             message="a broker promoted after the total outage")
    # a status may time out while the new primary catches its backups up on 3,000 queues: asked again
    primary = wait_for(lambda: next((b for b in c if (c.try_status(b) or {}).get("role") == "primary"), None), 60,
                       message="the promoted broker answering as the primary")
    wait_all_ready(c, [b for b in c if b is not primary])
    assert_all_hold(c, c, expected)
