"""report.py without Spark: the summary a user reads and the files written, from hand-made tables."""
from __future__ import annotations

import datetime

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyspark")
pytest.importorskip("matplotlib")

from haqueue.audit import report  # noqa: E402
from haqueue.audit.exits import EXIT_LOSS, EXIT_OK  # noqa: E402
from haqueue.audit.lag import Audit  # noqa: E402
from haqueue.audit.lag_command import exit_code  # noqa: E402

T = pd.Timestamp("2027-01-15 08:00:00")


def make_audit(missing: int) -> Audit:
    backups = pd.DataFrame([
        {"queue": "orders", "backup": "b1", "received": 1200, "live": 1000, "catchup": 200, "lag_p50_ms": 0.4,
         "lag_p95_ms": 1.25, "lag_p99_ms": 3.0, "lag_max_ms": 12.5, "missing": missing, "unverified": 2,
         "duplicates": 0, "order_violations": 0, "dequeues_not_mirrored": 1},
        {"queue": "orders", "backup": "b2", "received": 1000, "live": 1000, "catchup": 0, "lag_p50_ms": float("nan"),
         "lag_p95_ms": float("nan"), "lag_p99_ms": float("nan"), "lag_max_ms": float("nan"), "missing": 0,
         "unverified": 0, "duplicates": 3, "order_violations": 1, "dequeues_not_mirrored": 0}])
    queues = pd.DataFrame([{"queue": "orders", "enqueued": 1000, "completed": 990, "dequeued": 800,
                            "completion_p50_ms": 0.8, "completion_p95_ms": 2.0, "completion_p99_ms": 2.5,
                            "completion_max_ms": 9.0, "backups": 2, "missing": missing, "unverified": 2,
                            "duplicates": 3, "order_violations": 1, "dequeues_not_mirrored": 1, "unattested": 0,
                            "at_risk": 0, "diverged": 0, "kept_aside": 0}])
    epochs = pd.DataFrame([
        {"epoch": 1, "primary": "b0", "first_event": T, "last_event": T + pd.Timedelta(seconds=5),
         "enqueued": 600, "completed": 600, "dequeued": 500, "inherited_dequeued": 0, "unattested": 0},
        {"epoch": 2, "primary": "b1", "first_event": T + pd.Timedelta(seconds=7),
         "last_event": T + pd.Timedelta(seconds=9), "enqueued": 400, "completed": 390, "dequeued": 300,
         "inherited_dequeued": 100, "unattested": 0}])
    timeline = pd.DataFrame([{"backup": "b1", "time": T + pd.Timedelta(seconds=s), "messages": 100,
                              "lag_p50_ms": 0.4, "lag_p99_ms": 2.0 + s % 3, "lag_max_ms": 5.0}
                             for s in (0, 1, 2, 3, 4, 8, 9)])
    bad = pd.DataFrame([{"file": "b0-000001.jsonl", "problem": "unparsable", "lines": 1, "example": '{"t":1'}])
    totals = {"events": 5000, "judged": 5000, "brokers": 3, "first": datetime.datetime(2027, 1, 15, 8),
              "last": datetime.datetime(2027, 1, 15, 8, 0, 9), "bad_lines": 1, "bucket_ms": 1000.0}
    return Audit(totals=totals, queues=queues, backups=backups, epochs=epochs, timeline=timeline,
                 problems=pd.DataFrame(columns=["problem", "queue", "seq", "message_id", "backup", "time"]),
                 bad_input=bad)


def test_summary_reads_as_the_user_sees_it():
    assert report.summary(make_audit(missing=0)).splitlines() == [
        "haqueue audit: 5,000 events from 3 brokers, 2027-01-15 08:00:00.000 to 2027-01-15 08:00:09.000 UTC; "
        "5,000 in the window judged",
        "bad input: 1 line skipped (1 unparsable; see bad_input.csv)",
        "epoch 1: primary b0 2027-01-15 08:00:00.000–2027-01-15 08:00:05.000, 600 enqueued, 600 confirmed, "
        "500 dequeued",
        "epoch 2: primary b1 2027-01-15 08:00:07.000–2027-01-15 08:00:09.000, 400 enqueued, 390 confirmed, "
        "300 dequeued (100 from earlier epochs)",
        "queue orders: 1,000 enqueued, 990 confirmed (completion p50 0.8 ms p99 2.5 ms), 800 dequeued",
        "  backup b1: 1,200 received (200 in catch-up), lag p50 0.4 ms p95 1.25 ms p99 3 ms max 12.5 ms; missing 0, "
        "duplicates 0, out of order 0, dequeues not mirrored 1, 2 not verifiable",
        "  backup b2: 1,000 received (0 in catch-up), lag p50 - p95 - p99 - max -; missing 0, duplicates 3, "
        "out of order 1, dequeues not mirrored 0",
        "no loss: every confirmed message reached every backup that was ready",
    ]
    assert report.summary(make_audit(missing=4)).splitlines()[-1] == \
        "LOSS: 4 confirmed messages missing on a ready backup (see problems.csv)"


def test_unattested_messages_make_the_summary_say_it_cannot_tell():
    audit = make_audit(missing=0)
    audit.queues["unattested"] = 7
    audit.epochs.loc[0, "unattested"] = 7
    lines = report.summary(audit).splitlines()
    assert "epoch 1: primary b0 2027-01-15 08:00:00.000–2027-01-15 08:00:05.000, 600 enqueued, 600 confirmed, " \
           "500 dequeued; 7 unattested" in lines
    assert lines[-1] == ("CANNOT TELL: 7 messages held by backups with no record from the primary that sent them "
                         "(its log lost its tail: a machine crash?), so loss there cannot be ruled out "
                         "(see problems.csv)")
    assert not any(line.startswith("no loss") for line in lines)


def test_confirmations_at_risk_and_diverged_messages_are_named_and_are_not_no_loss():
    audit = make_audit(missing=0)
    audit.queues["at_risk"] = 5
    lines = report.summary(audit).splitlines()
    assert lines[4] == ("queue orders: 1,000 enqueued, 990 confirmed (completion p50 0.8 ms p99 2.5 ms), 800 dequeued, "
                        "5 at risk (confirmed while fewer than a majority held them)")
    assert lines[-1] == ("AT RISK: 5 messages confirmed while fewer than a majority of the cluster held them "
                         "(ha.min_confirmations below a majority): a partition can lose such a message "
                         "(see problems.csv)")
    audit.queues["at_risk"], audit.queues["diverged"] = 0, 1
    lines = report.summary(audit).splitlines()
    assert lines[4].endswith(", 800 dequeued, 1 diverged (kept aside at a rejoin)")
    assert lines[-1] == ("DIVERGED: 1 confirmed message kept aside by a rejoining broker, never on the new primary: "
                         "`haqueue diverged list` / `republish` on that broker's data_dir (see problems.csv)")
    assert exit_code(audit) == EXIT_LOSS


def test_messages_kept_aside_but_never_confirmed_are_named_and_are_no_loss():
    """A primary killed after journalling a message, before confirming it, keeps it aside at its rejoin."""
    audit = make_audit(missing=0)
    audit.queues["kept_aside"] = 1
    lines = report.summary(audit).splitlines()
    assert lines[4].endswith(", 800 dequeued, 1 kept aside at a rejoin (never confirmed as replicated)")
    assert lines[-2].startswith("no loss: ")
    assert lines[-1] == ("KEPT ASIDE: 1 message never confirmed as replicated, held by a rejoining broker and never "
                         "on the new primary (a publisher may have sent it again): `haqueue diverged list` / "
                         "`republish` on that broker's data_dir (see problems.csv)")
    assert exit_code(audit) == EXIT_OK


def test_ledgers_are_summed_up_per_queue_and_a_lost_message_is_a_loss():
    audit = make_audit(missing=0)
    audit.ledgers = pd.DataFrame([{"queue": "orders", "confirmed": 990, "received": 985, "lost": 2,
                                   "duplicated": 1, "unexpected": 0, "left_on_queue": 3}])
    lines = report.summary(audit).splitlines()
    assert lines[-2:] == [
        "ledgers, queue orders: 990 confirmed by producers, 985 received by consumers; lost 2, duplicated 1, "
        "unexpected 0, 3 left on the queue",
        "LOSS: 2 confirmed messages lost: never received by a consumer and not on the queue at the end "
        "(see ledger_problems.csv)"]


def test_outputs_are_every_table_the_chart_and_the_summary(tmp_path):
    audit = make_audit(missing=0)
    for name, data in report.outputs(audit):
        (tmp_path / name).write_bytes(data)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"{t}.{ext}" for t in ("queues", "backups", "epochs", "lag_timeline", "problems", "bad_input",
                                            "ledgers", "ledger_problems", "shards")
                     for ext in ("parquet", "csv")} | {"lag.png", "summary.txt"}
    assert pd.read_parquet(tmp_path / "backups.parquet")["duplicates"].tolist() == [0, 3]
    assert (tmp_path / "summary.txt").read_text() == report.summary(audit) + "\n"
    assert (tmp_path / "lag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chart_breaks_a_backup_line_where_it_received_nothing():
    points = make_audit(0).timeline
    broken = report._break_gaps(points, 1000.0)
    assert len(broken) == len(points) + 1  # one gap: 4 s to 8 s
    gap = broken[broken["lag_p99_ms"].isna()].iloc[0]
    assert gap["time"] == T + pd.Timedelta(seconds=7.5)
