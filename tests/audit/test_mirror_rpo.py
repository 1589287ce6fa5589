"""The mirror's recovery point, audited (design/audit-events.md, "The mirror's recovery point"): a 2-broker source
cluster mirrors two queues (and not a third) to a standby broker 50 ms away (tests/mirror/delay_relay.py), both
writing audit events. The site link is cut, more is published and confirmed at the source, and the source's site is
lost (both brokers killed). `haqueue audit lag --standby-events` must find, per mirrored queue, exactly the messages
the clients' ledger has confirmed at the source and the standby never got: the recovery point's count, and its age
past `--mirror-rpo-max`, the one finding `--fail-on-loss` then fails on. One audit: the Spark run is what costs.
The definitions are checked apart, on a synthetic pair of logs with known answers.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from proton import Message

from audit_command import run_audit_command
from eventsets import MS, SECOND, T0, EventLog
from ha_harness import browse, receive, send_all, wait_for
from harness import BrokerProcess, unexpected_exits
from haqueue.admin import AdminClient
from haqueue.audit import schema
from haqueue.audit.ledger import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mirror"))
from delay_relay import DelayRelay  # noqa: E402
from mirror_harness import MIRROR_PASSWORD, MIRROR_USER, SITE_DELAY, standby_config  # noqa: E402

pytestmark = pytest.mark.slow

MIRRORED = {"orders.0": 30, "orders.1": 20}  # queue -> messages confirmed at the source after the cut
MIRRORED_FIRST = 150  # per queue, before the cut
CONSUMED = 40  # from orders.0 at the source, before the cut
RPO_AGE = 1.0  # seconds the source's log goes on past its last confirmation: at least the messages' time at risk


def events(directory: Path) -> list[dict[str, Any]]:
    """Every whole line of the event files under directory."""
    return [json.loads(line) for f in directory.rglob("*.jsonl") for line in f.read_text().splitlines()
            if line.endswith("}")]


def drained(source: Any, primary: BrokerProcess) -> bool:
    """The source's primary mirrors both queues, connected, with nothing held back."""
    with AdminClient(primary.address, 5.0, "ops", source.password) as admin:
        status = admin.request("READ", "mirror")[2]["source"]
    return status["connected"] and sorted(q["queue"] for q in status["queues"]) == sorted(MIRRORED) \
        and all(q["lag_messages"] == 0 for q in status["queues"])


def standby_depths(standby: BrokerProcess) -> dict[str, int]:
    with AdminClient(standby.address, 5.0) as admin:
        status = admin.request("READ", "mirror")[2]["standby"]
    return {q["queue"]: q["messages"] for q in status["queues"]}


def test_the_audit_counts_what_a_site_loss_cost(ha_cluster, tmp_path) -> None:
    pytest.importorskip("pyspark")
    source_events, standby_events = tmp_path / "source-events", tmp_path / "standby-events"
    standby = BrokerProcess(tmp_path / "standby", standby_config(audit={"dir": str(standby_events)}),
                            name="standby").start()
    host, port = standby.address.rsplit(":", 1)
    relay = DelayRelay((host, int(port)), SITE_DELAY)
    ledger_file = tmp_path / "ledger.jsonl"
    try:
        source = ha_cluster(size=2, extra={"audit": {"dir": str(source_events)}, "mirror": {
            "cluster": "site-a", "to": [relay.address], "username": MIRROR_USER, "password": MIRROR_PASSWORD,
            "queues": ["orders.*"]}})
        primary = source.start_cluster()
        with Ledger(ledger_file, client="clients") as ledger:
            def publish(queue: str, ids: list[str]) -> None:
                send_all(source.public, queue, [Message(id=i, body=i, durable=True) for i in ids])
                for i in ids:  # send_all returns once every one is confirmed
                    ledger.confirmed(queue, i)
            for queue in MIRRORED:
                publish(queue, [f"{queue}-{i}" for i in range(MIRRORED_FIRST)])
            publish("local.q", [f"local-{i}" for i in range(50)])  # not mirrored: no recovery point of its own
            wait_for(lambda: drained(source, primary), 30, message="the mirror's lag drains")
            for m in receive(source.public, "orders.0", CONSUMED):  # mirrored first: applied, then dequeued
                ledger.received("orders.0", m.id)
            wait_for(lambda: standby_depths(standby) == {"orders.0": MIRRORED_FIRST - CONSUMED,
                                                         "orders.1": MIRRORED_FIRST}, 30,
                     message="the consumption mirrored")

            # the site link cut, more confirmed at the source, a second of its log at least, then the site lost
            relay.cut()
            for queue, n in MIRRORED.items():
                publish(queue, [f"{queue}-{i}" for i in range(MIRRORED_FIRST, MIRRORED_FIRST + n)])
        confirmed_last = max(e["t"] for e in events(source_events) if e["event"] == "complete")
        wait_for(lambda: max(e["t"] for e in events(source_events)) > confirmed_last + RPO_AGE * 1e6, 10,
                 message="the source's log a while past its last confirmation")
        for b in source:
            source.kill(b)

        # the ledger: what the source confirmed and still held at its loss, less what the standby holds
        entries = [json.loads(line) for line in ledger_file.read_text().splitlines()]
        depths = standby_depths(standby)
        expected: dict[str, set[str]] = {}
        for queue in MIRRORED:
            confirmed = [e["id"] for e in entries if e["queue"] == queue and e["op"] == "confirmed"]
            consumed = {e["id"] for e in entries if e["queue"] == queue and e["op"] == "received"}
            on_standby = {m.id for m in browse(standby.address, queue, depths[queue])}
            expected[queue] = {i for i in confirmed if i not in consumed} - on_standby
            assert len(expected[queue]) == MIRRORED[queue], queue
        standby.stop()  # its last events and a mark

        out = tmp_path / "audit"
        result = run_audit_command(["audit", "lag", "--events", str(source_events), "--standby-events",
                                    str(standby_events), "--out", str(out), "--master", "local[2]", "--fail-on-loss",
                                    "--mirror-rpo-max", str(RPO_AGE)])
        print(result.stdout, result.stderr[-3000:])
        mirror = pd.read_csv(out / "mirror.csv").set_index("queue")
        assert sorted(mirror.index) == sorted(MIRRORED)  # local.q was never mirrored
        for queue, n in MIRRORED.items():
            row = mirror.loc[queue]
            assert (row["confirmed"], row["applied"], row["unmirrored"], row["duplicates"]) == (
                MIRRORED_FIRST + n, MIRRORED_FIRST, n, 0), (queue, row.to_dict())
            assert row["rpo_max_messages"] >= n and row["rpo_max_s"] > RPO_AGE, row.to_dict()
            assert row["lag_p50_ms"] >= SITE_DELAY * 1000  # a transfer crosses the relay's delay once
        problems = pd.read_csv(out / "mirror_problems.csv")
        assert set(problems["problem"]) == {"unmirrored"}
        for queue in MIRRORED:
            assert set(problems.loc[problems["queue"] == queue, "message_id"]) == expected[queue], queue
        timeline = pd.read_csv(out / "mirror_timeline.csv")
        assert set(timeline["queue"]) == set(MIRRORED) and timeline["unmirrored"].max() >= max(MIRRORED.values())
        # the recovery point is information, except past --mirror-rpo-max: the one finding here
        assert result.returncode == 1, result.stderr[-3000:]
        said = result.stdout.splitlines()
        assert said[-1].startswith("MIRROR RPO: queue orders.0's confirmed messages were at risk"), said[-1]
        assert "queue orders.1's" in said[-1]
        assert not [line for line in said if line.startswith(("LOSS:", "AT RISK:", "DIVERGED:", "CANNOT TELL:"))]
    finally:
        relay.close()
        crashed = unexpected_exits([standby])
        standby.stop()
        print(standby.log()[-3000:])
        assert not crashed, crashed


def test_the_definitions_on_known_events(spark, tmp_path) -> None:
    """A source broker a0 and its standby s0, queue q (and local, never mirrored), with known answers: msg-1
    mirrored 50 ms after its enqueue; msg-2 consumed at the source before it was mirrored (safe, not lost); msg-3
    applied twice (a duplicate); msg-4 never mirrored, at risk from its confirmation to the end of a0's log (1.999 s);
    msg-5 never mirrored either: the standby's client published an id of that name after the switch-over (it has a
    `complete`), which is not the mirror's apply."""
    from haqueue.audit.mirror_rpo import analyse_mirror
    from haqueue.audit.sources import tune_for

    source, standby = EventLog(), EventLog()
    primary = (schema.STANDALONE, 0)

    def at_source(event: str, t: int, seq: int, queue: str = "q") -> None:
        confirmed = {"backups": []} if event == "complete" else {}
        source.message("a0", 1, event, t, *primary, seq, queue=queue, **confirmed)

    def at_standby(event: str, t: int, seq: int, own: int) -> None:
        confirmed = {"backups": []} if event == "complete" else {}
        standby.add("s0", 2, event, T0 + t, *primary, queue="q", uid="uid-standby-q", seq=own,
                    message_id=f"msg-{seq}", **confirmed)
    for seq, enqueued in ((1, 0), (2, 10 * MS), (3, 100 * MS), (4, SECOND), (5, 2 * SECOND + 400 * MS)):
        at_source("enqueue", T0 + enqueued, seq)
        at_source("complete", T0 + enqueued + (100 * MS if seq == 5 else MS), seq)
    at_source("dequeue", T0 + 20 * MS, 2)
    at_source("enqueue", T0, 9, queue="local")
    at_source("complete", T0 + MS, 9, queue="local")
    source.mark("a0", 1, T0 + 3 * SECOND, *primary)
    at_standby("enqueue", 50 * MS, 1, own=1)
    at_standby("enqueue", 200 * MS, 3, own=2)
    at_standby("enqueue", 300 * MS, 3, own=3)
    at_standby("enqueue", 4 * SECOND, 5, own=4)
    at_standby("complete", 4 * SECOND + MS, 5, own=4)
    tune_for(spark, 0)  # a shuffle partition for these few events, as the audit sizes them
    read = spark.read.schema(schema.DDL)
    found = analyse_mirror(read.json(str(source.write(tmp_path / "source"))),
                           read.json(str(standby.write(tmp_path / "standby"))), SECOND, 100, rpo_limit=1.5)
    table = found.queues.set_index("queue")
    assert list(table.index) == ["q"]
    q = table.loc["q"]
    assert (q["confirmed"], q["applied"], q["unmirrored"], q["duplicates"], q["rpo_max_messages"]) == (5, 2, 2, 1, 2)
    assert q["rpo_max_s"] == 1.999 and (q["lag_p50_ms"], q["lag_max_ms"]) == (50.0, 100.0), q.to_dict()
    assert sorted(zip(found.problems["problem"], found.problems["message_id"])) == [
        ("duplicate", "msg-3"), ("unmirrored", "msg-4"), ("unmirrored", "msg-5")]
    assert [(row.unmirrored, row.age_s) for row in found.timeline.itertuples()] == [(1, 0.999), (2, 1.999)]
    assert list(found.over_limit["queue"]) == ["q"]
