"""A real 3-broker cluster writing audit events: publish and consume under load, kill -9 the primary,
promote a backup, let the old primary return as a backup; then `haqueue audit lag --fail-on-loss`
over the events must report zero loss, and its figures must agree with what the clients saw. Under the
floor's opt-out, a primary cut off from its backups confirms alone and its messages diverge at its
rejoin: the audit must name both."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
from proton import Message

from audit_command import run_audit_command
from ha_harness import Load, send_all, wait_for

pytestmark = pytest.mark.slow


def last_marks(events: Path) -> dict[str, int]:
    """Each broker's newest mark in its log (µs since the epoch)."""
    newest: dict[str, int] = {}
    for f in events.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.endswith("}") and (e := json.loads(line))["event"] == "mark":
                newest[e["broker"]] = max(newest.get(e["broker"], 0), e["t"])
    return newest


def test_kill9_failover_audits_with_zero_loss(ha_cluster, tmp_path):
    pytest.importorskip("pyspark")
    from haqueue.audit.lag import MIRROR_GRACE_US

    events, out = tmp_path / "events", tmp_path / "audit"
    c = ha_cluster(extra={"audit": {"dir": str(events)}})
    old = c.start_cluster()
    ledger = tmp_path / "ledger.jsonl"
    load = Load(c.public, "audited", ledger=ledger).start()
    try:
        wait_for(lambda: load.confirmed_count() >= 300 and load.received_count() >= 100, 30,
                 message="traffic before the failover")
        c.kill(old)
        new = wait_for(lambda: c.best_backup(exclude=[old]), 10, message="a ready backup")
        c.promote(new)
        old.start()
        base = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= base + 300, 30, message="300 confirmed after the failover")
        load.stop_producer()
        wanted = set(load.confirmed)
        wait_for(lambda: wanted <= set(load.received), 30, message=f"every confirmed message received "
                                                                   f"({load.report()})")
    finally:
        load.stop()
    assert load.report()["lost"] == []
    c.wait_ready(old, timeout=20, queues=["audited"])
    # Every broker's log goes on past the last dequeues' mirroring (the audit judges a dequeue not
    # mirrored on a backup whose log went on MIRROR_GRACE_US after it): a mark that much later from each.
    covered = int(time.time() * 1e6) + MIRROR_GRACE_US
    names = {b.name for b in c.brokers}

    def marked() -> bool:
        marks = last_marks(events)
        return marks.keys() >= names and min(marks[name] for name in names) >= covered
    wait_for(marked, 10, interval=0.2, message="every broker's mark a grace period after the last dequeue")
    c.shutdown()

    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master", "local[2]",
                                "--fail-on-loss", "--ledger", str(ledger)])
    print(result.stdout, result.stderr[-3000:])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no loss: every confirmed message reached every backup that was ready" in result.stdout

    backups = pd.read_csv(out / "backups.csv")
    queue = backups[backups["queue"] == "audited"].set_index("backup")
    epochs = pd.read_csv(out / "epochs.csv")
    assert list(epochs["primary"]) == [old.name, new.name]  # the failover, seen from the logs
    assert list(epochs["epoch"]) == [1, 2]
    assert queue["missing"].sum() == 0
    # The two first backups received every message of epoch 1 live; the new primary's backups every
    # message of epoch 2; the returning old primary caught up.
    first_backups = [b.name for b in c.brokers if b is not old]
    assert (queue.loc[first_backups, "live"] > 0).all()
    assert queue.loc[old.name, "received"] > 0
    assert (queue.loc[first_backups, "lag_p50_ms"] < 1000).all()
    # The audit saw every message the clients had confirmed, the killed primary's last ones included.
    queues = pd.read_csv(out / "queues.csv").set_index("queue")
    assert queues.loc["audited", "completed"] >= load.confirmed_count()
    bad = pd.read_csv(out / "bad_input.csv")
    assert bad["lines"].sum() <= 1  # at most the killed primary's torn last line
    assert json.dumps(sorted(set(bad["problem"]))) in ('[]', '["unparsable"]')
    assert (out / "lag.png").stat().st_size > 10_000
    # What the clients saw, from their ledger: nothing lost, nothing unexpected; a send retried across
    # the failover may have been received twice.
    ledgers = pd.read_csv(out / "ledgers.csv").set_index("queue")
    assert ledgers.loc["audited", "confirmed"] == load.confirmed_count()
    assert ledgers.loc["audited", "received"] == len(set(load.received))
    assert ledgers.loc["audited", ["lost", "unexpected"]].tolist() == [0, 0]
    assert ledgers.loc["audited", "duplicated"] == len(load.report()["duplicates"])


def test_a_partition_under_the_opt_out_is_named_at_risk_and_diverged(ha_cluster, tmp_path):
    """Issue 27 on real brokers under `min_confirmations: 1`: the primary, its backups hung (SIGSTOP), confirms
    alone once `backup_timeout` drops them (at risk) and is killed; a backup takes over, and the old primary
    rejoins and keeps aside what the new primary never had (diverged). The audit names both and fails."""
    pytest.importorskip("pyspark")
    events, out = tmp_path / "events", tmp_path / "audit"
    c = ha_cluster(backup_timeout=1.0, ha_extra={"min_confirmations": 1}, extra={"audit": {"dir": str(events)}})
    p = c.start_cluster()
    send_all(c.public, "q", [Message(id=f"m-{i}", body=i, durable=True) for i in range(3)])
    for b in c.brokers[1:]:
        c.wait_depth(b, "q", 3)
    c.sigstop(c[1])
    c.sigstop(c[2])
    alone = [Message(id=f"m-{i}", body=i, durable=True) for i in range(3, 10)]
    send_all(c.public, "q", alone[:1])  # confirmed once both backups are dropped: the rest at once
    send_all(c.public, "q", alone[1:])
    c.kill(p)
    c.sigcont(c[1])
    c.sigcont(c[2])
    c.promote(c[1], force=True)
    c.start(0)  # the old primary rejoins as a backup of b1
    c.wait_backups_ready(c[1], [p.name, c[2].name])
    kept = {m.id for m in alone} - {m.id for m in c.browse(c[1], "q")}
    c.shutdown()

    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master", "local[2]",
                                "--fail-on-loss"])
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    problems = pd.read_csv(out / "problems.csv")
    named = {kind: set(problems.loc[problems["problem"] == kind, "message_id"]) for kind in ("at risk", "diverged")}
    assert named == {"at risk": {m.id for m in alone}, "diverged": kept}, result.stdout
    assert len(kept) >= 5  # the first may have reached the backups' sockets before they were dropped
    queues = pd.read_csv(out / "queues.csv").set_index("queue")
    assert queues.loc["q", ["missing", "at_risk", "diverged", "kept_aside"]].tolist() == [0, len(alone), len(kept), 0]
