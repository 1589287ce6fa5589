"""A real 3-broker cluster writing audit events: publish and consume under load, kill -9 the primary,
promote a backup, let the old primary return as a backup; then `haqueue audit lag --fail-on-loss`
over the events must report zero loss, and its figures must agree with what the clients saw."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from audit_command import run_audit_command
from ha_harness import Load, wait_for

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
