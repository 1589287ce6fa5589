"""The Spark job on synthetic event sets with known answers (eventsets.failover_scenario): exact lags,
a planted missing message, a planted duplicate, an out-of-order pair, a dequeue not mirrored, a
failover; confirmations at risk and messages kept aside at a rejoin (eventsets.partition_scenario);
bad input counted, never fatal; the event files of 0.1.0 and of this build read alike, one of a newer format
refused; the time window; the command line, its paths as URIs and its exit codes, a failed Spark job's among
them; spark-submit."""
from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from audit_command import run_audit_command
from eventsets import EPOCH2, SECOND, T0, EventLog, partition_scenario
from harness import REPO_ROOT
from haqueue.audit import schema

pytestmark = pytest.mark.slow  # Spark: a session, then seconds per audit


@pytest.fixture
def audit(failover_audit):
    """The audit of the failover scenario (scenario_dir), made once for the run (conftest.py)."""
    return failover_audit


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
        ("q", 12, 12, 6, 2.0, 2.0, 2.0, 2.0, 3, 1, 0, 1, 1, 1, 0, 0, 0, 0)]
    assert list(audit.queues.columns) == [
        "queue", "enqueued", "completed", "dequeued", "completion_p50_ms", "completion_p95_ms", "completion_p99_ms",
        "completion_max_ms", "backups", "missing", "unverified", "duplicates", "order_violations",
        "dequeues_not_mirrored", "unattested", "at_risk", "diverged", "kept_aside"]
    assert audit.missing == 1 and audit.at_risk == 0  # every confirmation named 1 or 2 backups of 3 brokers


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


def test_percentiles_are_the_nearest_rank_of_every_value(spark, tmp_path):
    """20,001 messages, each with a lag and a completion latency of its own (more values than percentile_approx's
    accuracy of 10,000 keeps exact): each p50/p95/p99 the audit reports is the value at rank ceil(p * n) of the
    sorted values, as computed here."""
    from haqueue.audit import lag

    n, log = 20_001, EventLog()
    lags = [1 + (seq * 7_919) % 30_011 for seq in range(n)]  # µs, in no order
    latencies = [500 + (seq * 104_729) % 40_009 for seq in range(n)]
    for seq in range(n):
        t = T0 + seq * 20
        log.message("b0", 1, schema.ENQUEUE, t, schema.PRIMARY, 1, seq)
        log.message("b1", 2, schema.REPLICATE, t + lags[seq], schema.BACKUP, 1, seq, mode=schema.LIVE, enqueued=t)
        log.message("b0", 1, schema.COMPLETE, t + latencies[seq], schema.PRIMARY, 1, seq, backups=["b1"])
    for broker, run, role in (("b0", 1, schema.PRIMARY), ("b1", 2, schema.BACKUP)):
        log.mark(broker, run, T0 + SECOND, role, 1)
    audit = lag.analyse(spark, str(log.write(tmp_path / "events")))

    def nearest_rank(values: list[int]) -> list[float]:
        ordered = sorted(values)
        return [ordered[math.ceil(p * len(ordered)) - 1] / 1000 for p in (0.5, 0.95, 0.99)] + [ordered[-1] / 1000]

    assert rows(audit.backups, ["lag_p50_ms", "lag_p95_ms", "lag_p99_ms", "lag_max_ms"]) == [tuple(nearest_rank(lags))]
    assert rows(audit.queues, ["completion_p50_ms", "completion_p95_ms", "completion_p99_ms", "completion_max_ms"]) == [
        tuple(nearest_rank(latencies))]


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


def test_bad_lines_are_counted_and_the_rest_audited_as_the_scenario(audit, spark, scenario_dir, tmp_path):
    """The scenario's files, most converted to Parquet (columnar.py), lines that are not events added to b2's (then
    converted) and to b0's second file (left JSON lines), beside a file that is not an event file: the same figures
    as the scenario's own files, and the bad lines counted, each kind under its file's name. b1's JSON lines, left
    beside their Parquet twin, are read once."""
    from haqueue.audit import columnar, lag, parts

    events = tmp_path / "events"
    events.mkdir()

    def bad_lines(log: Path) -> str:
        """An unknown event, a missing field, a wrong type (the line cannot be read), a line torn by a crash."""
        good = json.loads(log.read_text().splitlines()[1])
        bad = [{**good, "event": "teleport"}, {k: v for k, v in good.items() if k != "seq"}, {**good, "seq": "seven"}]
        return "".join(json.dumps(line) + "\n" for line in bad) + json.dumps(good)[:40]

    for log in scenario_dir.glob("*.jsonl"):
        if log.name == "b0-000002.jsonl":
            (events / log.name).write_text(log.read_text() + bad_lines(log))
            continue
        text = log.read_text() + (bad_lines(log) if log.name.startswith("b2") else "")
        counts = columnar.convert(io.BytesIO(text.encode()), str(events / (log.stem + parts.PARQUET)))
        assert counts.kept == (2 if log.name.startswith("b2") else 0)  # the wrong type and the torn line
        if log.name.startswith("b1"):
            shutil.copy(log, events)
    (events / "notes.txt").write_text("not an event file\n")
    converted = lag.analyse(spark, str(events))
    assert converted.totals == {**audit.totals, "bad_lines": 8}
    for name, table in audit.tables.items():
        if name != "bad_input":
            pd.testing.assert_frame_equal(converted.tables[name], table)
    assert rows(converted.bad_input, ["file", "problem", "lines"]) == [
        (file, problem, lines) for file in ("b0-000002.jsonl", "b2-000004.parquet")
        for problem, lines in (("missing field", 1), ("unknown event", 1), ("unparsable", 2))]
    assert "teleport" in converted.bad_input["example"].iloc[1]


def test_files_of_0_1_0_and_of_this_build_are_read_alike_and_a_newer_format_is_refused(spark, scenario_dir,
                                                                                      tmp_path):
    """A rolling upgrade: brokers of both releases write into one directory (design/data-formats.md). b0's files
    keep 0.1.0's names, b1's and b2's take this build's (b2's converted to Parquet): every line is read. A file of
    a newer format is refused, naming it, before any is read."""
    from haqueue.audit import columnar, sources
    from haqueue.formats import EXIT_NEWER_FORMAT

    events = tmp_path / "events"
    events.mkdir()
    logs = sorted(scenario_dir.glob("*.jsonl"))
    for log in logs:
        broker, part = log.stem.split("-")
        if broker == "b0":
            shutil.copy(log, events)
        elif broker == "b1":
            shutil.copy(log, events / f"b1~f1-{part}.jsonl")
        else:
            columnar.convert(str(log), str(events / f"b2~f1-{part}.parquet"))
    found = sources.read_events(spark, str(events))
    assert (found.files, sources.usable(found.lines).count()) == (
        len(logs), sum(len(log.read_text().splitlines()) for log in logs))
    newer = events / "b3~f2-000001.parquet"
    columnar.convert(io.BytesIO(b'{"t": 1}\n'), str(newer))
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(tmp_path / "out"),
                                "--master", "local[2]"])
    assert (result.returncode, result.stdout, result.stderr.splitlines()[-1]) == (
        EXIT_NEWER_FORMAT, "", f"haqueue audit: file://{newer}: format 2 is newer than this build reads (1): this "
                               f"build is older than the one that wrote it; install that release or newer")


def test_a_time_window_judges_only_its_events(spark, scenario_dir):
    """Epoch 2 alone: its two messages, confirmed naming b2, which has them: no loss."""
    from haqueue.audit import lag

    audit = lag.analyse(spark, str(scenario_dir), since=T0 + 2 * SECOND, until=T0 + 4 * SECOND)
    assert rows(audit.queues, ["queue", "enqueued", "completed", "dequeued", "missing"]) == [("q", 2, 2, 1, 0)]
    assert rows(audit.backups, ["backup", "received", "live", "catchup", "lag_p50_ms", "missing", "duplicates"]) == [
        ("b0", 6, 0, 6, None, 0, 0), ("b2", 2, 2, 0, 0.3, 0, 0)]
    assert rows(audit.epochs, ["epoch", "primary", "inherited_dequeued"]) == [(2, "b1", 1)]


def test_shuffles_are_sized_from_the_input_and_a_setting_given_stays(spark):
    """A partition per 64 MB up to four per core (local[2]: 8), one and no adaptive execution under 64 MB;
    a setting the command was given (--conf) stays, even in a session that was already running."""
    from haqueue.audit import sources

    sources.tune_for(spark, 100 * sources.BYTES_PER_PARTITION)
    assert spark.conf.get("spark.sql.shuffle.partitions") == "8"
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    sources.tune_for(spark, 0, given={"spark.sql.shuffle.partitions": "3"})
    assert (spark.conf.get("spark.sql.shuffle.partitions"), spark.conf.get("spark.sql.adaptive.enabled")) == (
        "3", "false")
    sources.tune_for(spark, 0)
    assert spark.conf.get("spark.sql.shuffle.partitions") == "1"


def test_the_drivers_memory_is_sized_from_the_input_listed_as_the_audit_reads_it(tmp_path):
    """On a local master the driver holds the cache of every line: more for a larger input, at most half the
    machine; on a cluster the executors do. The input is weighed as read_events weighs it: a Parquet file's
    JSON twin and hidden names left out."""
    pytest.importorskip("pyspark")
    from haqueue.audit import sources

    (tmp_path / "_spark").mkdir()
    for name, size in [("a.jsonl", 1000), ("a.parquet", 10), ("b.jsonl", 500), (".b.parquet.tmp", 7),
                       ("_spark/c.jsonl", 3)]:
        (tmp_path / name).write_bytes(b"x" * size)
    assert sources.input_size(str(tmp_path)) == sources.input_size(f"file://{tmp_path}") == 500 + 10 * 10
    assert sources.input_size("hdfs:///audit") is None and sources.driver_memory("local[*]", None) == "4g"
    mb = [int(sources.driver_memory("local[*]", size)[:-1]) for size in (1 << 20, 1 << 30, 1 << 40)]
    half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 >> 20
    assert mb[0] < mb[1] < mb[2] == half
    assert sources.driver_memory("spark://h:7077", 1 << 20) == sources.driver_memory("spark://h:7077", 1 << 40)


def test_the_audit_asks_for_the_throughput_collector_and_fair_scheduling(spark):
    """The session this process starts asks for JVM_OPTIONS for the driver and the executors (bench/RESULTS.md:
    G1's threads took their share of 2 cores), and for pools sharing the cores (the problems' pool, lag.py). Here
    PYSPARK_SUBMIT_ARGS (tests/conftest.py) picks the JVM's own. An input known to be small gets C1 alone and the
    serial collector (SMALL_JVM_OPTIONS: its audit is nearly all a fixed part)."""
    from haqueue.audit import sources

    conf = spark.sparkContext.getConf()
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert sources.JVM_OPTIONS in conf.get(key), (key, conf.get(key))
    small, large = sources.BYTES_PER_PARTITION - 1, sources.BYTES_PER_PARTITION
    assert sources.jvm_options(small) == sources.SMALL_JVM_OPTIONS == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert sources.jvm_options(large) == sources.jvm_options(None) == sources.JVM_OPTIONS
    assert conf.get("spark.scheduler.mode") == sources.SCHEDULER_MODE == "FAIR"


def test_a_backup_whose_log_ends_first_is_unverified_not_missing(spark, tmp_path):
    """b1 crashed: its log stops before the primary confirmed seq 2 naming it. Seq 2 may have
    reached it in the lost tail of its log, so the audit cannot call it missing. The audit runs in a notebook's
    own scheduler pool: the problems' jobs run in a pool of their own (lag.PROBLEMS_POOL), and the notebook's is
    its thread's again once the audit is done (checked on this audit: one audit is some 15 s)."""
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
    context = spark.sparkContext
    context.setLocalProperty("spark.scheduler.pool", "notebook")
    try:
        audit = lag.analyse(spark, str(log.write(tmp_path / "events")))
        assert context.getLocalProperty("spark.scheduler.pool") == "notebook"
    finally:
        context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]
    assert rows(audit.backups, ["backup", "received", "missing", "unverified"]) == [("b1", 1, 0, 1)]


@pytest.mark.filterwarnings("ignore:toPandas attempted Arrow optimization")  # PySpark's, on the failure
@pytest.mark.parametrize("broken", ["facts._sound", "lag._measures", "lag._order_violations"])
def test_a_query_that_fails_fails_the_audit_and_leaves_nothing_kept(spark, scenario_dir, monkeypatch, broken):
    """A failed Spark job fails the audit with its own reason, whether in the facts (persisted as they are made),
    in the audit's thread (the measures, while the copies out of order are checked beside it) or beside it (the
    copies out of order); and what the audit persisted or checkpointed so far is freed, as after an audit that
    ends well: a notebook's session goes on."""
    from pyspark.sql import functions as F

    from haqueue.audit import facts, failures, lag

    module, name = broken.split(".")
    fails = F.raise_error(F.lit(f"{name} broke")).isNull()  # in the tasks of the query it is part of
    replacement = {"_sound": lambda *args: fails,
                   "_measures": lambda judged, proof: judged.enqueues.filter(fails).collect(),
                   "_order_violations": lambda replicas: replicas.filter(fails)}[name]

    def kept() -> tuple[set[int], bool]:
        return (set(spark.sparkContext._jsc.getPersistentRDDs().keySet()),
                bool(spark._jsparkSession.sharedState().cacheManager().isEmpty()))

    before = kept()
    monkeypatch.setattr({"facts": facts, "lag": lag}[module], name, replacement)
    with pytest.raises(Exception) as failure:
        lag.analyse(spark, str(scenario_dir))
    assert failures.reason(failure.value).startswith(f"the Spark job failed: [USER_RAISED_EXCEPTION] {name} broke")
    assert kept() == before


def test_command_line_writes_tables_chart_summary_and_fails_on_loss(scenario_dir, tmp_path):
    out = tmp_path / "out"
    since = datetime.fromtimestamp(T0 / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    result = run_audit_command(["audit", "lag", "--events", str(scenario_dir), "--out", str(out), "--master",
                                "local[2]", "--since", since, "--fail-on-loss"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "LOSS: 1 confirmed message missing on a ready backup (see problems.csv)"
    assert (out / "summary.txt").read_text() == result.stdout
    for name in ("queues", "backups", "epochs", "lag_timeline", "problems", "bad_input"):
        assert pd.read_parquet(out / f"{name}.parquet").equals(pd.read_parquet(out / f"{name}.parquet"))
        assert (out / f"{name}.csv").exists()
    assert pd.read_csv(out / "backups.csv")["missing"].tolist() == [0, 0, 1]
    assert (out / "lag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_standalone_brokers_run_audits_clean(broker_factory, tmp_path):
    """A broker without HA: no backup receives a copy, so the per-backup table is empty, and the audit still
    counts the queue's messages and passes."""
    from proton import Message

    from ha_harness import receive, send_all

    events, out = tmp_path / "events", tmp_path / "out"
    b = broker_factory(name="solo", audit={"dir": str(events)})
    send_all(b.addresses[0], "orders", [Message(id=f"order-{i}", body=i) for i in range(3)])
    receive(b.addresses[0], "orders", 2)
    b.stop()
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master", "local[2]",
                                "--fail-on-loss"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert pd.read_csv(out / "backups.csv").empty
    assert rows(pd.read_csv(out / "queues.csv"), ["queue", "enqueued", "completed", "dequeued", "backups", "missing"]
                ) == [("orders", 3, 3, 2, 0, 0)]


def test_confirmations_at_risk_and_messages_kept_aside_are_named_and_fail_the_audit(tmp_path):
    """Issue 27's partition under the opt-out: b0 confirmed seq 4 and 5 alone (at risk), then kept them
    aside at its rejoin (diverged, not a mirrored dequeue); --fail-on-loss exits 1 on them, nothing missing.
    Seq 6, kept aside too but never confirmed, is named apart: not a loss."""
    events, out = partition_scenario().write(tmp_path / "events"), tmp_path / "out"
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master", "local[2]",
                                "--fail-on-loss"])
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    summary = result.stdout.splitlines()
    assert "queue q: 6 enqueued, 6 confirmed (completion p50 2 ms p99 2 ms), 0 dequeued, 2 at risk (confirmed " \
           "while fewer than a majority held them), 2 diverged (kept aside at a rejoin), 1 kept aside at a rejoin " \
           "(never confirmed as replicated)" in summary
    assert summary[-3:] == [
        "AT RISK: 2 messages confirmed while fewer than a majority of the cluster held them (ha.min_confirmations "
        "below a majority): a partition can lose such a message (see problems.csv)",
        "DIVERGED: 2 confirmed messages kept aside by a rejoining broker, never on the new primary: "
        "`haqueue diverged list` / `republish` on that broker's data_dir (see problems.csv)",
        "KEPT ASIDE: 1 message never confirmed as replicated, held by a rejoining broker and never on the new "
        "primary (a publisher may have sent it again): `haqueue diverged list` / `republish` on that broker's "
        "data_dir (see problems.csv)"]
    queues = pd.read_csv(out / "queues.csv")
    assert rows(queues, ["queue", "completed", "missing", "dequeues_not_mirrored", "at_risk", "diverged",
                         "kept_aside"]) == [("q", 6, 0, 0, 2, 2, 1)]
    problems = pd.read_csv(out / "problems.csv")
    assert rows(problems, ["problem", "queue", "seq", "message_id", "backup"]) == [
        ("at risk", "q", 4, "msg-4", None), ("at risk", "q", 5, "msg-5", None),
        ("diverged", "q", 4, "msg-4", "b0"), ("diverged", "q", 5, "msg-5", "b0"),
        ("kept aside", "q", 6, "msg-6", "b0")]


def _primary_and_backup(log: EventLog, seqs: range, replicated: set[int]) -> None:
    """b0 primary of epoch 1 enqueues and confirms `seqs` naming b1; b1 receives `replicated`."""
    log.mark("b0", 1, T0, schema.PRIMARY, 1)
    log.mark("b1", 2, T0, schema.BACKUP, 1)
    for seq in seqs:
        t = T0 + seq * 1000
        log.message("b0", 1, schema.ENQUEUE, t, schema.PRIMARY, 1, seq)
        if seq in replicated:
            log.message("b1", 2, schema.REPLICATE, t + 100, schema.BACKUP, 1, seq, mode=schema.LIVE, enqueued=t)
        log.message("b0", 1, schema.COMPLETE, t + 500, schema.PRIMARY, 1, seq, backups=["b1"])


def test_a_truncated_primary_log_leaves_unattested_messages_and_cannot_tell(tmp_path):
    """The primary's machine crashed: its log lost the tail the page cache held (here cut mid-line).
    The backup holds messages the primary's log never mentions: the audit counts them unattested
    and, under --fail-on-loss, says it cannot tell (exit 3) instead of "no loss"."""
    log = EventLog()
    _primary_and_backup(log, range(1, 11), set(range(1, 11)))
    log.mark("b1", 2, T0 + 2 * SECOND, schema.BACKUP, 1)
    events = log.write(tmp_path / "events")
    primary_file = events / "b0-000001.jsonl"
    text = primary_file.read_text()
    cut = text.index('"seq": 7,')  # the enqueue of seq 7 and everything after it is gone
    primary_file.write_text(text[:cut])
    out = tmp_path / "out"
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master", "local[2]",
                                "--fail-on-loss"])
    assert result.returncode == 3, result.stdout + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == (
        "CANNOT TELL: 4 messages held by backups with no record from the primary that sent them (its log lost "
        "its tail: a machine crash?), so loss there cannot be ruled out (see problems.csv)")
    queues = pd.read_csv(out / "queues.csv")
    assert rows(queues, ["queue", "completed", "missing", "unattested"]) == [("q", 6, 0, 4)]
    epochs = pd.read_csv(out / "epochs.csv")
    assert rows(epochs, ["epoch", "primary", "unattested"]) == [(1, "b0", 4)]
    problems = pd.read_csv(out / "problems.csv")
    assert sorted(problems.loc[problems["problem"] == "unattested", "seq"]) == [7, 8, 9, 10]


def test_ledgers_find_lost_duplicated_unexpected_and_what_is_left(spark, tmp_path):
    """b0 (epoch 1) confirms msg-1..6, b1 receives all but msg-6 and takes over (epoch 2); consumers
    get msg-1..3 (msg-2 twice) and a message no producer sent; msg-4 and 5 stay on b1's queue. msg-7, which
    b0 confirmed as kept off the backups (x-replicate: false), is gone with b0: kept local, not lost, not
    missing, not at risk."""
    from haqueue.audit import lag

    log = EventLog()
    _primary_and_backup(log, range(1, 7), set(range(1, 6)))
    log.message("b0", 1, schema.ENQUEUE, T0 + 7000, schema.PRIMARY, 1, 7)
    log.message("b0", 1, schema.COMPLETE, T0 + 7500, schema.PRIMARY, 1, 7, backups=[], replicated=False)
    for seq in (1, 2, 3):
        log.message("b1", 2, schema.DEQUEUE, T0 + SECOND + seq, schema.PRIMARY, 2, seq)
    log.mark("b1", 2, T0 + 2 * SECOND, schema.PRIMARY, 2)
    events = log.write(tmp_path / "events")
    producer, consumer = tmp_path / "producer.jsonl", tmp_path / "consumer.jsonl"
    producer.write_text("".join(json.dumps({"client": "p", "queue": "q", "id": f"msg-{i}", "op": "confirmed",
                                            "t": T0 + i * 1000 + 600}) + "\n" for i in range(1, 8)))
    received = ["msg-1", "msg-2", "msg-2", "msg-3", 9]  # 9: a numeric message-id, never sent
    consumer.write_text("".join(json.dumps({"client": "c", "queue": "q", "id": mid, "op": "received",
                                            "t": T0 + SECOND + i}) + "\n" for i, mid in enumerate(received))
                        + '{"client": "c", "queue": "q", "id": "msg-1", "op": "sent", "t": 1}\n')
    audit = lag.analyse(spark, str(events), ledgers=[str(producer), str(consumer)])
    assert rows(audit.ledgers, lag.LEDGER_COLUMNS) == [("q", 7, 4, 1, 1, 1, 2, 1)]
    assert sorted(rows(audit.ledger_problems, ["problem", "queue", "id"])) == [
        ("duplicated", "q", "msg-2"), ("lost", "q", "msg-6"), ("unexpected", "q", "9")]
    assert audit.missing == 1 and audit.lost == 1  # msg-6: found from the events and from the ledgers
    assert audit.at_risk == 0
    assert rows(audit.bad_input, ["file", "problem", "lines"])[-1] == ("consumer.jsonl", "unknown op", 1)


def test_a_failed_spark_job_exits_4_in_one_line_and_bad_paths_2(scenario_dir, tmp_path, monkeypatch, local_spark):
    """An event file gone between Spark's listing and its tasks (as on a worker that does not see the
    events directory): the job fails, and the command says so in one line and exits 4, never 1, the code
    of a loss; --debug shows the traceback too. Paths it cannot use are usage errors, found through
    Hadoop's file systems; so is an audit asked for another master than the session this process runs,
    which it leaves running."""
    from haqueue.audit import lag_command

    events = tmp_path / "events"
    shutil.copytree(scenario_dir, events)
    gone = next(events.glob("b2-*.jsonl"))
    read = lag_command.read_events

    def read_then_delete(spark, directory):
        frames = read(spark, directory)  # Spark has listed the files
        gone.unlink()
        return frames

    monkeypatch.setattr(lag_command, "read_events", read_then_delete)
    result = run_audit_command(["audit", "lag", "--events", f"file://{events}", "--out", str(tmp_path / "out"),
                                "--master", "local[2]", "--fail-on-loss"])
    assert result.returncode == 4, result.stdout + result.stderr[-3000:]
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"haqueue audit: the Spark job failed: executors cannot read file://{gone} (FILE_NOT_EXIST); is the events "
        "directory shared with every worker?")
    assert "Traceback" not in result.stderr and "py4j" not in result.stderr.lower()
    shutil.copy(scenario_dir / gone.name, gone)
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(tmp_path / "out"),
                                "--master", "local[2]", "--debug"])
    assert result.returncode == 4 and "Traceback" in result.stderr and "Py4JJavaError" in result.stderr
    out, a_file = ["--out", str(tmp_path / "out")], tmp_path / "a-file"
    a_file.write_text("")
    running = local_spark()  # an audit stops the session it runs in at its end: these never start or join one
    for args, error in [
            (["--events", f"file://{tmp_path}/none", *out], f"no such directory: file://{tmp_path}/none"),
            (["--events", str(events), "--ledger", str(tmp_path / "none.jsonl"), *out],
             f"no such ledger file: {tmp_path}/none.jsonl"),
            (["--events", str(events), "--out", str(a_file)], f"--out is a file, not a directory: {a_file}")]:
        result = run_audit_command(["audit", "lag", *args, "--master", "local[2]"])
        assert (result.returncode, result.stderr) == (2, f"haqueue audit: {error}\n")
        assert not running.sparkContext._jsc.sc().isStopped()
    for args, error in [
            (["--events", str(events), "--out", "s3a://bucket/report"],
             "cannot reach s3a://bucket/report: java.lang.RuntimeException: java.lang.ClassNotFoundException: Class "
             "org.apache.hadoop.fs.s3a.S3AFileSystem not found (is the file system's client on Spark's classpath, "
             "e.g. hadoop-aws for s3a?)"),
            (["--events", "hdfs:///audit", *out],  # this machine has no Hadoop config: no fs.defaultFS of hdfs
             "cannot reach hdfs:///audit: java.io.IOException: Incomplete HDFS URI, no host: hdfs:///audit (the URI "
             "names no host, and the default file system, fs.defaultFS, is file:///: write hdfs://HOST/audit (for "
             "hdfs the namenode), or set fs.defaultFS (core-site.xml in HADOOP_CONF_DIR, or --conf "
             "spark.hadoop.fs.defaultFS=...))")]:
        result = run_audit_command(["audit", "lag", *args, "--master", "local[2]"])
        assert (result.returncode, result.stderr.splitlines()[-1]) == (2, f"haqueue audit: {error}")
    running = local_spark()
    result = run_audit_command(["audit", "lag", "--events", str(events), *out, "--master", "spark://127.0.0.1:7077"])
    assert (result.returncode, result.stderr) == (2, "haqueue audit: this process already runs a Spark session on "
                                                     "local[2]: it cannot audit on spark://127.0.0.1:7077 (stop that "
                                                     "session first, or audit on local[2])\n")
    assert running.range(3).count() == 3


def long_run() -> EventLog:
    """b0 confirms seq 1..3,000 from T0 naming b1, which has them all: 9,004 events; and, a second
    earlier, seq 0, which b1 never logged. A fresh JVM takes seconds over its first jobs: long enough
    for progress lines."""
    log = EventLog()
    log.message("b0", 1, schema.ENQUEUE, T0 - SECOND, schema.PRIMARY, 1, 0)
    log.message("b0", 1, schema.COMPLETE, T0 - SECOND + 500, schema.PRIMARY, 1, 0, backups=["b1"])
    for seq in range(1, 3_001):
        t = T0 + seq * 20
        log.message("b0", 1, schema.ENQUEUE, t, schema.PRIMARY, 1, seq)
        log.message("b1", 2, schema.REPLICATE, t + 100, schema.BACKUP, 1, seq, mode=schema.LIVE, enqueued=t)
        log.message("b0", 1, schema.COMPLETE, t + 500, schema.PRIMARY, 1, seq, backups=["b1"])
    for broker, run, role in (("b0", 1, schema.PRIMARY), ("b1", 2, schema.BACKUP)):
        log.mark(broker, run, T0 + SECOND, role, 1)
    return log


def test_progress_counts_the_jobs_that_ended_between_two_looks(spark):
    """Jobs far shorter than the progress's period, all between two looks: the look at the end still
    counts them, done, numbered from this audit's first job."""
    from haqueue.audit.progress import Progress

    out = io.StringIO()
    spark.range(10).count()  # an earlier job, not this audit's
    before = set(spark.sparkContext.statusTracker().getJobIdsForGroup())
    with Progress(spark.sparkContext, "a range", out):
        spark.range(1000).repartition(3).count()
    jobs = len(set(spark.sparkContext.statusTracker().getJobIdsForGroup()) - before)
    lines = out.getvalue().splitlines()
    assert lines[0] == "haqueue audit: reading a range"
    assert re.fullmatch(rf"haqueue audit: {jobs} Spark jobs, (\d+)/\1 tasks", lines[-1]), lines


def spark_submit(args: list[str], python: str, master: str = "local[2]",
                 conf: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """The spark-submit form of `haqueue audit lag ARGS` (submit.py), on `master` with spark-submit's options
    `conf`, the driver's Python `python` (PYSPARK_DRIVER_PYTHON and PYSPARK_PYTHON, as design/audit-events.md
    says)."""
    import pyspark

    from haqueue.audit import submit

    # The JVM options the tests give Spark (tests/conftest.py): PYSPARK_SUBMIT_ARGS, less its last word.
    options = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))[:-1]
    env = {**os.environ, "PYSPARK_DRIVER_PYTHON": python, "PYSPARK_PYTHON": python,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    command = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", master, *options,
               "--conf", "spark.ui.enabled=false", *conf, submit.__file__, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)


def test_spark_submit_shows_progress_on_stderr_and_the_summary_alone_on_stdout(tmp_path):
    """spark-submit, with the environment design/audit-events.md gives, as a user runs it (its JVM's output
    too): what it reads, then Spark's tasks as they finish, on stderr, though spark-submit merges its
    Python's stderr into its stdout; stdout has the summary alone. Events and output as URIs: `file://`,
    and `viewfs://` (Hadoop's mount table, here over a local directory) for an output written through
    Hadoop. Its --since, in seconds since the epoch, leaves seq 0's loss out: no loss, even under
    --fail-on-loss. Then without that environment: the driver's Python cannot import pandas, exit 4."""
    events = long_run().write(tmp_path / "events")
    size = sum(f.stat().st_size for f in events.iterdir()) / 1e6
    mount = ["--conf", f"spark.hadoop.fs.viewfs.mounttable.audit.link./report=file://{tmp_path}/report"]
    result = spark_submit([*mount, "--events", f"file://{events}", "--out", "viewfs://audit/report",
                           "--since", str(T0 / 1e6), "--fail-on-loss"], sys.executable)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout == (tmp_path / "report" / "summary.txt").read_text()
    assert result.stdout.startswith("haqueue audit: 9,004 events from 2 brokers")
    assert "; 9,002 in the window judged" in result.stdout.splitlines()[0]
    assert result.stdout.splitlines()[-1] == "no loss: every confirmed message reached every backup that was ready"
    progress = [line for line in result.stderr.splitlines() if line.startswith("haqueue audit: ")]
    assert progress[0] == f"haqueue audit: reading 2 event files, {size:,.1f} MB"
    tasks = [re.fullmatch(r"haqueue audit: ([\d,]+) Spark jobs?, ([\d,]+)/([\d,]+) tasks", line)
             for line in progress[1:]]
    assert tasks and all(tasks), result.stderr[-3000:]
    counts = [tuple(int(n.replace(",", "")) for n in task.groups()) for task in tasks]
    # Counted from the audit's start, no figure goes down: jobs started, tasks done, tasks of the stages started.
    assert all(map(lambda a, b: all(x <= y for x, y in zip(a, b)), counts, counts[1:])), progress
    # Spark's start at INFO, as spark-submit's JVM logs, would be some 50 lines: only the context's first three
    # (its version, OS and Java) come before the audit's log level applies.
    assert len([line for line in result.stderr.splitlines() if " INFO " in line]) <= 3, result.stderr[-5000:]

    no_packages = tmp_path / "python-without-site-packages"
    no_packages.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_packages.chmod(0o755)
    result = spark_submit(["--events", str(events), "--out", str(tmp_path / "out")], str(no_packages))
    assert (result.returncode, result.stdout) == (4, ""), result.stdout + result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        f"haqueue audit: the driver's Python ({sys.executable}) cannot import pandas: set PYSPARK_DRIVER_PYTHON "
        "and PYSPARK_PYTHON to the Python haqueue is installed in (its venv's bin/python)")
