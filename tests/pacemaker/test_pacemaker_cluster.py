"""haqueue under a real three-node Corosync/Pacemaker cluster, with an IPaddr2 virtual IP.

One cluster (pcmk_cluster.py) serves the whole module; before each test it is restored to
healthy. Clients always go through the VIP (10.213.47.100:5672) from the root namespace, as
an application would. Failover times (kill -9 or SIGSTOP to the first publish confirmed through
the VIP) are printed, and appended as JSON lines to $HAQUEUE_FAILOVER_RESULTS when it is set: they
are bench/RESULTS.md's figures against the 10 s target. The tests assert what happened (detected,
replaced, nothing lost), never how long it took: a slow machine is not a failure.

The cluster is also a mirror's source (design/mirroring.md; pcmk_mirror.py): its `orders.*` queues go to a standby
broker in the root namespace through a relay that delays 25 ms each way. The last test kills its primary under load
and checks that the new primary resumes the mirror; the other tests use queues that are not mirrored.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
from proton import Message

from ha_harness import browse
from harness import wait_for
from mirror_harness import Side
from pcmk_clients import Load, connect
from pcmk_cluster import CLONE, PING_TIMEOUT, POLL_INTERVAL, VIP_ADDRESS, Node, run
from pcmk_mirror import MirroredCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

OBSERVE = 4.0  # seconds a test watches for something that must not happen
# kill -9 failovers in a row: three give bench/RESULTS.md its figures ($HAQUEUE_FAILOVER_RESULTS); the suite asserts
# the same thing of each (nothing confirmed is lost, the killed broker comes back a ready backup), and the module's
# later tests fail over from a primary Pacemaker promoted, so one round is enough there (12-24 s each).
KILL9_ROUNDS = 3 if os.environ.get("HAQUEUE_FAILOVER_RESULTS") else 1


def record(kind: str, **values) -> None:
    line = {"kind": kind, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **values}
    print(f"\n{kind}: {json.dumps(line)}")
    path = os.environ.get("HAQUEUE_FAILOVER_RESULTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def send(queue: str, bodies: range) -> None:
    conn = connect(VIP_ADDRESS, timeout=10)
    try:
        sender = conn.create_sender(queue)
        for body in bodies:
            sender.send(Message(body=body, durable=True), timeout=10)
    finally:
        conn.close()


def receive_all(queue: str, n: int) -> list[int]:
    conn = connect(VIP_ADDRESS, timeout=10)
    try:
        receiver = conn.create_receiver(queue, credit=100)
        got = []
        for _ in range(n):
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
        return got
    finally:
        conn.close()


def assert_no_loss(load: Load) -> dict:
    report = load.report()
    assert report["confirmed"] > 0, report
    assert report["lost"] == [], f"confirmed but never received: {report}"
    return report


def test_cluster_comes_up_with_one_primary_two_ready_backups_and_the_vip(cluster):
    primary = cluster.primary_node()
    backups = [n for n in cluster.nodes if n is not primary]
    assert cluster.vip_on(primary)
    assert not any(cluster.vip_on(n) for n in backups)
    status = cluster.broker_status(primary)
    assert status["role"] == "primary" and status["state"] == "active", status
    assert {b["name"]: b["state"] for b in status["backups"]} == {n.name: "ready" for n in backups}
    # promotion scores: the primary's above any ready backup's
    assert cluster.promotion_score(primary) == "10000"
    for node in backups:
        def ready_score():
            score = cluster.promotion_score(node)
            return score is not None and 1000 <= int(score) < 2000
        wait_for(ready_score, 10, interval=POLL_INTERVAL,
                 message=f"a ready backup's score on {node.name}")
    # clients go through the VIP; a backup's own address refuses them
    send("up", range(10))
    assert receive_all("up", 10) == list(range(10))
    assert refuses_clients(f"{backups[0].ip}:5672")


def refuses_clients(address: str) -> bool:
    try:
        conn = connect(address, timeout=5)
    except Exception:  # noqa: BLE001 - closed at once: the backup refused us
        return True
    try:
        conn.create_sender("up")
    except Exception:  # noqa: BLE001
        return True
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
    return False


def test_kill9_of_primary_fails_over_through_the_vip_without_losing_confirmed_messages(cluster):
    for round_ in range(KILL9_ROUNDS):
        old = cluster.wait_healthy(90) if round_ == 0 else cluster.restore()
        load = Load(VIP_ADDRESS, f"kill9-{round_}").start()
        try:
            load.wait_confirmed(30, 20)
            pid = cluster.broker_pid(old)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            new = cluster.wait_new_primary(old, timeout=30)
            promoted = time.monotonic() - killed
            load.wait_confirmed(30, 30)
        finally:
            load.stop()
        report = assert_no_loss(load)
        recovery = load.recovery_after(killed)
        record("pacemaker-kill9-failover", old=old.name, new=new.name, seconds=round(recovery, 2),
               vip_moved_seconds=round(promoted, 2), confirmed=report["confirmed"],
               duplicates=report["duplicates"])
        assert new is not old
        # the killed broker is restarted by Pacemaker as a backup and catches up
        cluster.wait_healthy(60, allow_failures=True)


def test_partitioned_primary_is_replaced_and_rejoins_as_a_backup(cluster):
    old = cluster.primary_node()
    majority = [n for n in cluster.nodes if n is not old]
    send("split", range(100))
    run(["ip", "link", "set", old.veth, "down"])
    cut = time.monotonic()
    try:
        new = cluster.wait_new_primary(old, timeout=60, view=majority[0])
        replaced = time.monotonic() - cut
        # the isolated node has lost quorum: it stops its broker and its VIP
        wait_for(lambda: not cluster.broker_pids_in(old), 60, interval=POLL_INTERVAL,
                 message=f"no broker left on isolated {old.name}")
        wait_for(lambda: not cluster.vip_on(old), 10, interval=POLL_INTERVAL,
                 message=f"no VIP on isolated {old.name}")
        isolated = cluster.status(old)
        assert not isolated.quorate
        send("split", range(100, 200))
    finally:
        run(["ip", "link", "set", old.veth, "up"])
    healed = time.monotonic()
    cluster.wait_healthy(90, allow_failures=True)
    rejoined = time.monotonic() - healed
    assert cluster.primary_node() is new
    status = cluster.broker_status(old)
    assert status["role"] == "backup" and status["state"] == "ready" and status["epoch"] >= 1, status
    wait_for(lambda: cluster.queue_depth(old, "split") == 200, 20, interval=POLL_INTERVAL,
             message=f"200 messages on {old.name}")
    assert sorted(receive_all("split", 200)) == list(range(200))
    record("pacemaker-partition", old=old.name, new=new.name, replaced_seconds=round(replaced, 2),
           rejoined_seconds=round(rejoined, 2))


def test_pcs_move_and_ban_move_the_primary_cleanly(cluster):
    old = cluster.primary_node()
    target = next(n for n in cluster.nodes if n is not old)
    load = Load(VIP_ADDRESS, "moved").start()
    try:
        load.wait_confirmed(20, 20)
        started = time.monotonic()
        cluster.pcs("resource", "move", CLONE, target.name, "--promoted", "--wait=60", timeout=120)
        pcs_seconds = time.monotonic() - started
        moved = cluster.wait_new_primary(old, timeout=30)
        assert moved is target
        load.wait_confirmed(20, 30)
        outage = load.outage_after(started)
        # the move's constraint is gone (pcs 0.11 removes it) and the primary stays where it went
        assert "cli-prefer" not in cluster.pcs("constraint", "--full").stdout
        cluster.wait_healthy(60)
        # ban the primary's node for the promoted role: it moves again, then the ban is cleared
        cluster.pcs("resource", "ban", CLONE, target.name, "--promoted", "--wait=60", timeout=120)
        again = cluster.wait_new_primary(target, timeout=30)
        cluster.pcs("resource", "clear", CLONE)
        load.wait_confirmed(20, 30)
    finally:
        load.stop()
    report = assert_no_loss(load)
    cluster.wait_healthy(60)  # no failed action anywhere: both moves were clean demote + promote
    assert cluster.primary_node() is again
    record("pacemaker-move", old=old.name, new=target.name, then=again.name,
           pcs_move_seconds=round(pcs_seconds, 2), client_outage_seconds=round(outage, 2),
           confirmed=report["confirmed"])


def test_sigstopped_primary_is_detected_by_monitor_and_replaced(cluster):
    old = cluster.primary_node()
    pid = cluster.broker_pid(old)
    load = Load(VIP_ADDRESS, "stopped")
    # The VIP leaves the hung node before its broker stops: the clients never hear it close. A heartbeat gives up
    # the dead connection in seconds, as a failover-capable client does (without one the consumer sat on it and the
    # drain at the end waited 20-24 s); the producer's sends time out within send_timeout anyway.
    load.heartbeat = 2.0
    load.start()
    try:
        load.wait_confirmed(20, 20)
        stopped = time.monotonic()
        cluster.sigstop(pid)
        new = cluster.wait_new_primary(old, timeout=40)
        moved = time.monotonic() - stopped
        load.wait_confirmed(20, 30)
    finally:
        load.stop()
    report = assert_no_loss(load)
    recovery = load.recovery_after(stopped)
    # the hung broker was stopped (never left behind) and a fresh one runs there as a backup
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 30, interval=POLL_INTERVAL,
             message=f"hung broker {pid} gone")
    cluster.stopped_pids.discard(pid)
    cluster.wait_healthy(60, allow_failures=True)
    assert cluster.broker_pids_in(old) and pid not in cluster.broker_pids_in(old)
    failures = cluster.status().failures
    assert any(f.get("node") == old.name and f.get("task") == "monitor" for f in failures), failures
    record("pacemaker-sigstop-failover", old=old.name, new=new.name, seconds=round(recovery, 2),
           vip_moved_seconds=round(moved, 2), ping_timeout=PING_TIMEOUT, confirmed=report["confirmed"])


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_every_broker_killed_at_once_comes_back_on_the_freshest_store(cluster):
    """A total outage: every broker process SIGKILLed at once (the nodes stay up), and the old primary's
    node kept from restarting its broker for a while (a ban, cleared once the others are back). Its
    store is the freshest (the highest standing in the epoch), so the two restarted brokers get no
    promotion score and stay backups until it is back; then it alone scores and is promoted. No other
    broker is ever primary and no confirmed durable message is lost."""
    old = cluster.primary_node()
    others = [n for n in cluster.nodes if n is not old]
    send("outage", range(200))
    load = Load(VIP_ADDRESS, "outage-load").start()
    primaries: set[str] = set()

    def watch() -> None:
        for node in cluster.nodes:
            # as long as healthy() waits for the primary's answer: a shorter wait missed a primary busy recovering
            # under the parallel suite's load (seen: healthy, yet no poll had seen it primary)
            status = cluster.broker_status(node, timeout=3.0)
            if status and status["role"] == "primary":
                primaries.add(node.name)

    def watching(condition):
        """`condition`, noting who is primary at each poll."""
        def check() -> bool:
            watch()
            return condition()
        return check
    try:
        load.wait_confirmed(30, 20)
        pids = [cluster.broker_pid(n) for n in cluster.nodes]
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        cluster.pcs("resource", "ban", CLONE, old.name)
        wait_for(watching(lambda: all((cluster.broker_status(n, timeout=1.0) or {}).get("state") == "joining"
                                      for n in others)), 30, interval=POLL_INTERVAL,
                 message="the other two brokers restarted, joining")
        observed = time.monotonic()
        while time.monotonic() - observed < OBSERVE:  # what must not happen, for a while
            watch()
            assert [cluster.promotion_score(n) for n in others] == [None, None]
        assert primaries == set()
        cluster.pcs("resource", "clear", CLONE)
        cleared = time.monotonic()
        wait_for(watching(lambda: cluster.healthy(allow_failures=True)[0]), 90, interval=POLL_INTERVAL,
                 message="the cluster healthy again after the total outage")
        recovered = time.monotonic()
        load.wait_confirmed(30, 30)
    finally:
        cluster.pcs("resource", "clear", CLONE, check=False)
        load.stop()
    report = assert_no_loss(load)
    assert primaries == {old.name} and cluster.primary_node() is old
    for node in cluster.nodes:
        wait_for(lambda: cluster.queue_depth(node, "outage") == 200, 20, interval=POLL_INTERVAL,
                 message=f"200 messages on {node.name}")
    assert sorted(receive_all("outage", 200)) == list(range(200))
    record("pacemaker-total-outage", primary=old.name, others_joining_seconds=round(observed - killed, 2),
           healthy_seconds_after_ban_cleared=round(recovered - cleared, 2),
           client_recovery_seconds=round(load.recovery_after(killed), 2), confirmed=report["confirmed"],
           duplicates=report["duplicates"])


MIRRORED_QUEUES = ["orders.0", "orders.1"]  # mirrored (orders.*): a producer on each, a consumer on the first
LAG_TIMEOUT = 30.0


def mirrored(cluster: MirroredCluster, node: Node, drained: bool) -> bool:
    """The node's broker mirrors both queues, connected, the standby having confirmed a transfer of each from it;
    with `drained`, nothing waits."""
    status = cluster.mirror(node)
    return status["active"] and status["connected"] and [q["queue"] for q in status["queues"]] == MIRRORED_QUEUES \
        and all(q["state"] == "mirroring" and q["last_mirrored_seq"] > 0 and (q["lag_messages"] == 0 or not drained)
                for q in status["queues"])


@pytest.mark.timeout(300)
def test_a_source_under_pacemaker_fails_over_and_its_new_primary_resumes_the_mirror(cluster, standby) -> None:
    """Its primary killed (-9) under load through the VIP, Pacemaker promotes another and moves the VIP, and the
    new primary resumes the mirror from what the standby holds: once the clients stop and the lag drains, the
    standby holds exactly what the source holds, in order, and the clients' ledger agrees."""
    old = cluster.wait_healthy(90)
    producers = {q: Side(VIP_ADDRESS, q, producer=True).start() for q in MIRRORED_QUEUES}
    consumer: Side | None = None
    try:
        # The consumer starts once each queue has been mirrored: the primary's mirror connects once it has a queue
        # to mirror, and a message consumed before it is sent is never sent (a consumer started with the producers,
        # right after the primary was promoted, left orders.0 with nothing mirrored).
        wait_for(lambda: all(p.confirmed_count() >= 30 for p in producers.values()) and
                 mirrored(cluster, old, drained=False), LAG_TIMEOUT, message="mirrored under load")
        consumer = Side(VIP_ADDRESS, MIRRORED_QUEUES[0], producer=False).start()
        wait_for(lambda: consumer.received, LAG_TIMEOUT, message="the consumer taking messages")
        os.kill(cluster.broker_pid(old), signal.SIGKILL)
        new = cluster.wait_new_primary(old, timeout=30)
        more = {q: p.confirmed_count() + 30 for q, p in producers.items()}
        wait_for(lambda: all(producers[q].confirmed_count() >= n for q, n in more.items()) and
                 mirrored(cluster, new, drained=False), LAG_TIMEOUT,
                 message="the clients served and the mirror resumed by the new primary")
    finally:
        for side in [*producers.values(), *([consumer] if consumer else [])]:
            side.stop()
    assert consumer is not None
    wait_for(lambda: mirrored(cluster, new, drained=True), LAG_TIMEOUT, message="the mirror's lag drains")
    taken = set(consumer.received)
    for queue, producer in producers.items():
        at_source = [m.body for m in browse(VIP_ADDRESS, queue, cluster.queue_depth(new, queue) or 0)]
        at_standby = [m.body for m in browse(standby.address, queue, len(at_source))] if at_source else []
        assert at_standby == at_source == sorted(at_source), queue
        held = set(at_source)  # the ledger: each confirmed message not consumed is there (a retried one maybe twice)
        assert [b for b in producer.confirmed if b not in taken and b not in held] == [], queue
        assert held <= set(producer.confirmed) | {producer.next}, queue
