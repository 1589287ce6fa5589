"""Step 7 of design/sharding.md: in a sharded cluster every audit line names its process's shard, and `haqueue
audit lag` over a sharded run's event logs adds lag, missing copies and duplicates up by shard as well as by
queue."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from audit_command import run_audit_command
from ha_harness import cluster_factory, receive, send_all
from shard_harness import ShardCluster, owned_by

pytestmark = pytest.mark.timeout(300)
MESSAGES = 60


def audited_run(shard_cluster, events: Path) -> tuple[ShardCluster, list[str]]:
    """A 2-node, 2-shard run writing audit events: MESSAGES sent to a queue of each shard at n1's address and
    consumed at n2's (relayed wherever the kernel's pick is not the owner), then every process stopped."""
    c = shard_cluster(size=2, shards=2, replicas=2, extra={"audit": {"dir": str(events)}})
    c.start_shards()
    queues = [owned_by(shard, "audited") for shard in (0, 1)]
    for shard, queue in enumerate(queues):
        # The first message makes the queue; once every process of the shard has it, the backup's subscription is
        # live and the rest replicate live: a backup that catches up on them all has no lag to measure.
        send_all(c.client_address("n1"), queue, [f"{queue}-0"])
        for b in c.shard_processes(shard):
            c.wait_depth(b, queue, 1)
        send_all(c.client_address("n1"), queue, [f"{queue}-{i}" for i in range(1, MESSAGES)])
    for shard, queue in enumerate(queues):
        assert [m.body for m in receive(c.client_address("n2"), queue, MESSAGES)] == \
            [f"{queue}-{i}" for i in range(MESSAGES)]
        for b in c.shard_processes(shard):
            c.wait_depth(b, queue, 0)  # the backup applied every dequeue
    c.shutdown()  # each process writes a last mark as it stops
    return c, queues


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> tuple[Path, list[str]]:
    """One audited run for both tests (the run is what costs): its events directory and its queues."""
    directory = tmp_path_factory.mktemp("sharded")
    clusters = cluster_factory(ShardCluster, directory)
    try:
        _, queues = audited_run(next(clusters), directory / "events")
    finally:
        next(clusters, None)  # the factory's end: every process stopped, a crash fails the tests
    return directory / "events", queues


def test_every_audit_line_of_a_shard_process_names_its_shard(audited) -> None:
    events, queues = audited
    lines = {f.name: [json.loads(line) for line in f.read_text().splitlines()] for f in events.glob("*.jsonl")}
    assert {name.split("~")[0] for name in lines} == {"n1.s0", "n1.s1", "n2.s0", "n2.s1"}
    for name, events_of_file in lines.items():
        shard = int(name.split("~")[0].split(".s")[1])
        assert {e["shard"] for e in events_of_file} == {shard}, name
        assert {e["queue"] for e in events_of_file if "queue" in e} == {queues[shard]}, name
    kinds = {(e["broker"], e["event"]) for events_of_file in lines.values() for e in events_of_file}
    assert {("n1.s0", "complete"), ("n2.s0", "replicate"), ("n2.s1", "complete"), ("n1.s1", "replicate")} <= kinds


@pytest.mark.slow
def test_audit_lag_of_a_sharded_run_groups_by_shard(audited, tmp_path) -> None:
    pytest.importorskip("pyspark")
    (events, queues), out = audited, tmp_path / "audit"
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master", "local[2]",
                                "--fail-on-loss"])
    assert result.returncode == 0, result.stderr[-3000:]
    shards = pd.read_csv(out / "shards.csv")
    assert shards[["shard", "queues", "enqueued", "completed", "dequeued", "backups", "received", "missing",
                   "duplicates"]].values.tolist() == [[0, 1, MESSAGES, MESSAGES, MESSAGES, 1, MESSAGES, 0, 0],
                                                      [1, 1, MESSAGES, MESSAGES, MESSAGES, 1, MESSAGES, 0, 0]]
    assert (shards["lag_p50_ms"] >= 0).all() and (shards["lag_max_ms"] >= shards["lag_p50_ms"]).all()
    backups = pd.read_csv(out / "backups.csv")
    assert sorted(zip(backups["queue"], backups["backup"])) == sorted([(queues[0], "n2.s0"), (queues[1], "n1.s1")])
    assert f"shard 0: 1 queue, {MESSAGES} confirmed; 1 backup received {MESSAGES}" in result.stdout
    assert f"shard 1: 1 queue, {MESSAGES} confirmed; 1 backup received {MESSAGES}" in result.stdout
