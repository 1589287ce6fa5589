"""Per-message selective replication (design/replication.md, "Selective replication"): `x-replicate: durable`
replicates only a queue's durable messages, and the message annotation `x-replicate: false` keeps a message on
the primary alone. Such messages are confirmed at once (nothing waits for a backup), never reach a backup, live
or in catch-up, and are gone after a failover; the others are all there, in order."""
from __future__ import annotations

import json

import pytest
from proton import Message, symbol

from ha_harness import HaCluster, receive, send_all
from harness import run_haqueue

pytestmark = pytest.mark.slow

OFF = {symbol("x-replicate"): False}
PROMPT = 10.0  # seconds a publish may take to be confirmed: one waiting for a backup that never acks hangs past it


def test_durable_only_replication_keeps_transient_messages_on_the_primary(ha_cluster):
    c: HaCluster = ha_cluster(replicate="durable")  # the broker default: queues without x-replicate of their own
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "mixed")
    c.request(p, "CREATE", "queue", "every", body={"x-replicate": "all"})  # a queue's own level wins
    messages = [Message(id=f"m{i}", body=i, durable=i % 2 == 0) for i in range(21)]  # the last one durable
    durable = [i for i in range(21) if i % 2 == 0]
    send_all(c.public, "mixed", messages, timeout=PROMPT)
    send_all(c.public, "every", messages, timeout=PROMPT)
    # Under sync all a durable message is confirmed once every backup has it, and the link is ordered: any
    # transient message sent to a backup would be there by now.
    for b in c.brokers[1:]:
        c.wait_depth(b, "mixed", len(durable))
        assert c.bodies(b, "mixed") == durable
        c.wait_depth(b, "every", 21)
    info = c.queues(p)["mixed"]
    assert (info["depth"], info["kept_local"]) == (21, 10)
    assert c.queues(p)["every"]["kept_local"] == 0

    # Consuming the first two (a durable one, a transient one) on the primary dequeues the durable one on the
    # backups; the transient one's dequeue concerns nobody else.
    assert [m.body for m in receive(c.public, "mixed", 2)] == [0, 1]
    for b in c.brokers[1:]:
        c.wait_depth(b, "mixed", len(durable) - 1)

    c.kill(p)
    new = c.best_backup(exclude=[p])
    c.promote(new)
    assert c.bodies(new, "mixed") == durable[1:]  # exactly the durable ones, in order


def test_x_replicate_false_messages_stay_on_the_primary_and_go_with_it(ha_cluster, tmp_path):
    audit = tmp_path / "audit"
    c: HaCluster = ha_cluster(extra={"audit": {"dir": str(audit)}})
    p = c.start_cluster()
    late = c[2]
    c.request(p, "CREATE", "queue", "q", body={"x-replicate": "all"})
    c.request(p, "CREATE", "queue", "dur", body={"x-replicate": "durable"})  # under the default `all`
    c.kill(late)  # it comes back below and catches up: the kept messages are skipped there too

    def annotations(i: int) -> dict | None:
        return OFF if i % 3 == 0 else {symbol("x-replicate"): "false"} if i == 4 else None
    messages = [Message(id=f"m{i}", body=i, annotations=annotations(i)) for i in range(1, 31)]
    replicated = [i for i in range(1, 31) if annotations(i) is None]
    send_all(c.public, "q", messages[:15], timeout=PROMPT)
    send_all(c.public, "dur", [Message(body="transient"), Message(body="durable", durable=True),
                               Message(body="durable, kept", durable=True, annotations=OFF)], timeout=PROMPT)
    c.start(2)
    c.wait_ready(late, queues=["q"])
    send_all(c.public, "q", messages[15:], timeout=PROMPT)
    for b in c.brokers[1:]:  # b1 had each live, b2 the first half in catch-up
        c.wait_depth(b, "q", len(replicated))
        assert c.bodies(b, "q") == replicated
    assert c.depth(p, "q") == 30
    assert c.bodies(c[1], "dur") == c.bodies(late, "dur") == ["durable"]

    # The primary's audit log: each kept message's confirmation says it was not replicated and names no backup,
    # so the audit counts none of them missing, at risk, or lost once gone (design/audit-events.md).
    completes = [json.loads(line) for path in audit.glob("b0~f1-*.jsonl") for line in path.read_text().splitlines()
                 if '"event":"complete"' in line and '"queue":"q"' in line]
    kept = {e["message_id"] for e in completes if e.get("replicated") is False}
    assert kept == {f"m{i}" for i in range(1, 31) if annotations(i) is not None}
    assert all(e["backups"] == [] for e in completes if e["message_id"] in kept)
    assert all(e["backups"] for e in completes if e["message_id"] not in kept)

    c.kill(p)
    new = c.best_backup(exclude=[p])
    c.promote(new)
    assert [m.body for m in receive(c.public, "q", len(replicated))] == replicated
    assert c.depth(new, "q") == 0


def test_the_old_primary_rejoining_removes_its_older_local_messages_and_keeps_the_newer_aside(ha_cluster):
    """A durable message kept local is in its primary's journal only. That broker, back as a backup of the
    promoted one, holds what the new primary never had: one older than the newest message the new primary had
    at promotion looks consumed and is removed; a newer one is kept aside in data_dir/diverged (replication.md)."""
    c: HaCluster = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "q")
    send_all(c.public, "q", [Message(body="old local", durable=True, annotations=OFF),
                             Message(body="replicated", durable=True),
                             Message(body="new local", durable=True, annotations=OFF)], timeout=PROMPT)
    c.kill(p)
    new = c.best_backup(exclude=[p])
    c.promote(new)
    assert c.bodies(new, "q") == ["replicated"]

    c.start(0)
    c.wait_backups_ready(new, [b.name for b in c.brokers if b is not new])
    assert c.bodies(p, "q") == ["replicated"]
    status = c.status(p)["diverged"]
    assert (status["files"], status["messages"]) == (1, 1)
    listed = [json.loads(line) for line in run_haqueue(["diverged", "list", str(p.directory / "data")]).stdout.splitlines()]
    assert [(f["queue"], f["messages"]) for f in listed] == [("q", 1)]
