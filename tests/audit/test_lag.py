"""The Spark job on synthetic event sets with known answers (eventsets.failover_scenario): exact lags,
a planted missing message, a planted duplicate, an out-of-order pair, a dequeue not mirrored, a
failover; bad input counted, never fatal; the time window; the command line and its exit code."""
from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone

import pandas as pd
import pytest

from eventsets import EPOCH2, SECOND, T0, EventLog, failover_scenario
from harness import run_haqueue
from haqueue.audit import schema

pytestmark = pytest.mark.slow  # Spark: a session, then seconds per audit


@pytest.fixture(scope="module")
def scenario_dir(tmp_path_factory):
    return failover_scenario().write(tmp_path_factory.mktemp("scenario") / "events")


@pytest.fixture(scope="module")
def audit(spark, scenario_dir):
    from haqueue.audit import lag

    return lag.analyse(spark, str(scenario_dir))


def rows(table: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(None if pd.isna(v) else v for v in row) for row in table[columns].itertuples(index=False)]


def test_per_backup_figures(audit):
    columns = ["queue", "backup", "received", "live", "catchup", "lag_p50_ms", "lag_p95_ms", "lag_p99_ms",
               "lag_max_ms", "missing", "unverified", "duplicates", "order_violations", "dequeues_not_mirrored"]
    assert rows(audit.backups, columns) == [
        ("q", "b0", 6, 0, 6, None, None, None, None, 0, 0, 0, 0, 0),
        ("q", "b1", 10, 10, 0, 0.5, 1.0, 1.0, 1.0, 0, 0, 0, 0, 0),
        ("q", "b2", 12, 12, 0, 0.3, 0.3, 0.3, 0.3, 1, 0, 1, 1, 1),
    ]


def test_per_queue_figures(audit):
    assert rows(audit.queues, list(audit.queues.columns)) == [
        ("q", 12, 12, 6, 2.0, 2.0, 2.0, 2.0, 3, 1, 0, 1, 1, 1)]
    assert list(audit.queues.columns) == [
        "queue", "enqueued", "completed", "dequeued", "completion_p50_ms", "completion_p95_ms", "completion_p99_ms",
        "completion_max_ms", "backups", "missing", "unverified", "duplicates", "order_violations",
        "dequeues_not_mirrored"]
    assert audit.missing == 1


def test_the_failover_is_followed_to_the_new_primary(audit):
    """Epoch 2's primary is b1; it consumed seq 6, which b0 had enqueued in epoch 1."""
    epochs = audit.epochs
    assert rows(epochs, ["epoch", "primary", "enqueued", "completed", "dequeued", "inherited_dequeued"]) == [
        (1, "b0", 10, 10, 5, 0), (2, "b1", 2, 2, 1, 1)]
    assert list(epochs["first_event"]) == [pd.Timestamp(T0, unit="us"), pd.Timestamp(T0 + 2 * SECOND, unit="us")]


def test_each_problem_names_its_message(audit):
    assert rows(audit.problems, ["problem", "queue", "seq", "message_id", "backup"]) == [
        ("dequeue not mirrored", "q", 5, "msg-5", "b2"),
        ("duplicate", "q", 4, "msg-4", "b2"),
        ("missing", "q", 7, "msg-7", "b2"),
        ("out of order", "q", 5, "msg-5", "b2"),
    ]
    missing = audit.problems[audit.problems["problem"] == "missing"].iloc[0]
    assert missing["time"] == pd.Timestamp(T0 + 9 * 1000, unit="us")  # when the primary confirmed it


def test_lag_timeline_and_summary(audit):
    from haqueue.audit import report

    assert audit.totals["bucket_ms"] == 20.0  # 5 s of events: buckets of 20 ms, ~250 points
    timeline = audit.timeline
    b2 = timeline[timeline["backup"] == "b2"]
    assert rows(b2, ["messages", "lag_p99_ms", "lag_max_ms"]) == [(10, 0.3, 0.3), (2, 0.3, 0.3)]  # epoch 1, 2
    assert list(b2["time"]) == [pd.Timestamp(T0, unit="us"), pd.Timestamp(T0 + 2 * SECOND, unit="us")]
    text = report.summary(audit)
    assert "backup b2: 12 received (0 in catch-up), lag p50 0.3 ms p95 0.3 ms p99 0.3 ms max 0.3 ms; missing 1, " \
           "duplicates 1, out of order 1, dequeues not mirrored 1" in text
    assert "epoch 2: primary b1 2027-01-15 08:00:02.000–2027-01-15 08:00:05.000, 2 enqueued, 2 confirmed, " \
           "1 dequeued (1 from earlier epochs)" in text
    assert text.endswith("LOSS: 1 confirmed message missing on a ready backup (see problems.csv)")


def test_bad_lines_are_counted_and_the_rest_audited(spark, scenario_dir, tmp_path):
    from haqueue.audit import lag

    events = tmp_path / "events"
    shutil.copytree(scenario_dir, events)
    b2_log = next(events.glob("b2-*.jsonl"))
    good = json.loads(b2_log.read_text().splitlines()[1])
    with open(b2_log, "a", encoding="utf-8") as f:
        f.write(json.dumps({**good, "event": "teleport"}) + "\n")
        f.write(json.dumps({k: v for k, v in good.items() if k != "seq"}) + "\n")
        f.write(json.dumps({**good, "seq": "seven"}) + "\n")  # a wrong type: the line cannot be read
        f.write(json.dumps(good)[:40])  # torn by a crash
    (events / "notes.txt").write_text("not an event file\n")
    audit = lag.analyse(spark, str(events))
    assert rows(audit.bad_input, ["file", "problem", "lines"]) == [
        (b2_log.name, "missing field", 1), (b2_log.name, "unknown event", 1), (b2_log.name, "unparsable", 2)]
    assert audit.totals["bad_lines"] == 4
    assert "teleport" in audit.bad_input["example"].iloc[1]
    b2 = audit.backups[audit.backups["backup"] == "b2"].iloc[0]
    assert (b2["received"], b2["missing"], b2["duplicates"]) == (12, 1, 1)


def test_a_time_window_judges_only_its_events(spark, scenario_dir):
    """Epoch 2 alone: its two messages, confirmed naming b2, which has them: no loss."""
    from haqueue.audit import lag

    audit = lag.analyse(spark, str(scenario_dir), since=T0 + 2 * SECOND, until=T0 + 4 * SECOND)
    assert rows(audit.queues, ["queue", "enqueued", "completed", "dequeued", "missing"]) == [("q", 2, 2, 1, 0)]
    assert rows(audit.backups, ["backup", "received", "live", "catchup", "lag_p50_ms", "missing", "duplicates"]) == [
        ("b0", 6, 0, 6, None, 0, 0), ("b2", 2, 2, 0, 0.3, 0, 0)]
    assert rows(audit.epochs, ["epoch", "primary", "inherited_dequeued"]) == [(2, "b1", 1)]


def test_a_backup_whose_log_ends_first_is_unverified_not_missing(spark, tmp_path):
    """b1 crashed: its log stops before the primary confirmed seq 2 naming it. Seq 2 may have
    reached it in the lost tail of its log, so the audit cannot call it missing."""
    from haqueue.audit import lag

    log = EventLog()
    log.mark("b0", 1, T0, schema.PRIMARY, 1)
    log.mark("b1", 2, T0, schema.BACKUP, 1)
    for seq in (1, 2):
        t = T0 + seq * 1000
        log.message("b0", 1, schema.ENQUEUE, t, schema.PRIMARY, 1, seq)
        log.message("b0", 1, schema.COMPLETE, t + 500, schema.PRIMARY, 1, seq, backups=["b1"])
    log.message("b1", 2, schema.REPLICATE, T0 + 1100, schema.BACKUP, 1, 1, mode=schema.LIVE, enqueued=T0 + 1000)
    log.mark("b0", 1, T0 + SECOND, schema.PRIMARY, 1)
    audit = lag.analyse(spark, str(log.write(tmp_path / "events")))
    assert rows(audit.backups, ["backup", "received", "missing", "unverified"]) == [("b1", 1, 0, 1)]


def test_command_line_writes_tables_chart_summary_and_fails_on_loss(scenario_dir, tmp_path):
    out = tmp_path / "out"
    since = datetime.fromtimestamp(T0 / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    result = run_haqueue(["audit", "lag", "--events", str(scenario_dir), "--out", str(out), "--master", "local[2]",
                          "--since", since, "--fail-on-loss"], timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "LOSS: 1 confirmed message missing on a ready backup (see problems.csv)"
    assert (out / "summary.txt").read_text() == result.stdout
    for name in ("queues", "backups", "epochs", "lag_timeline", "problems", "bad_input"):
        assert pd.read_parquet(out / f"{name}.parquet").equals(pd.read_parquet(out / f"{name}.parquet"))
        assert (out / f"{name}.csv").exists()
    assert pd.read_csv(out / "backups.csv")["missing"].tolist() == [0, 0, 1]
    assert (out / "lag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    without = run_haqueue(["audit", "lag", "--events", str(scenario_dir), "--out", str(out),
                           "--master", "local[2]", "--since", str((T0 + 2 * SECOND) / 1e6)], timeout=600)
    assert without.returncode == 0, without.stderr[-3000:]
    assert without.stdout.splitlines()[-1] == "no loss: every confirmed message reached every backup that was ready"
