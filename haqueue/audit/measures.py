"""What the audit measures, defined once: replication lag and confirmed copies a backup lacks, as
DataFrame functions that the batch job (`haqueue audit lag`, lag.py) and the streaming job
(`haqueue audit watch`, watch.py) both call, on a whole event set or on one that grows.

Every function works on either kind of DataFrame, so each is written as a streaming query must be:
events carry `time` (a timestamp: what a watermark follows), and every join of the events of one
message on different brokers is an equi-join on the message (uid, seq) bounded in event time, so a
stream keeps only a few seconds of state and knows when a row can no longer match. The bounds are
wide enough never to matter on a healthy cluster (design/audit-watch.md says why each is safe);
the batch job applies the same bounds, so the two report the same figures for the same events.
"""
from __future__ import annotations

from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from haqueue.audit import schema

PERCENTILES = (0.5, 0.95, 0.99)
# A live replica is matched with the primary's enqueue event of its message at most this long
# before it (a backup slower than its `backup_timeout`, 5 s by default, is dropped); beyond it the
# lag is taken from the enqueue time the message carried. The stream holds a window's lag this long.
LAG_HORIZON = timedelta(seconds=5)
# Brokers' clocks may disagree by this much: an enqueue logged up to this long after its replica
# (by the backup's clock) is still its enqueue.
CLOCK_SKEW = timedelta(seconds=1)
# A copy a backup received, or a dequeue on the primary, counts for a confirmation at most this
# long before it: a copy comes before its confirmation, by at most about the primary's
# `backup_timeout` when it came in catch-up. The stream keeps this much of them as state.
COPY_HORIZON = timedelta(seconds=30)
# How long after a confirmation the backup's copy may be logged (its clock may run behind), and
# within which its log must show a mark for the copy's absence to count: backups mark every second.
DEFAULT_BOUND = timedelta(seconds=5)
MIN_BOUND = timedelta(seconds=2)  # a mark must be able to fall inside it


def timed(events: DataFrame) -> DataFrame:
    """The events with `time`, their `t` as a timestamp (event time for watermarks and windows)."""
    return events.withColumn("time", F.timestamp_micros("t"))


def _seconds(span: timedelta) -> Column:
    return F.expr(f"INTERVAL {span.total_seconds()} SECONDS")


def live_lag(replicas: DataFrame, enqueues: DataFrame) -> DataFrame:
    """One row per live replica: queue, backup, time, lag_us, the backup's receive time minus the
    primary's enqueue time: from the primary's `enqueue` event, else (its log lost it, or it lies
    beyond LAG_HORIZON) the time the message carried. Catch-up copies have no lag: catching up is
    not keeping up.

    replicas: `replicate` events with the receiving broker as `backup`; enqueues: the primaries'
    `enqueue` events."""
    live = replicas.filter(F.col("mode") == schema.LIVE)
    origin = enqueues.select(F.col("uid").alias("enq_uid"), F.col("seq").alias("enq_seq"),
                             F.col("time").alias("enq_time"), F.col("t").alias("enq_t"))
    same = ((F.col("uid") == F.col("enq_uid")) & (F.col("seq") == F.col("enq_seq"))
            & (F.col("enq_time") >= F.col("time") - _seconds(LAG_HORIZON))
            & (F.col("enq_time") <= F.col("time") + _seconds(CLOCK_SKEW)))
    enqueued = F.coalesce(F.col("enq_t"), F.when(F.col("enqueued") > 0, F.col("enqueued")))
    return live.join(origin, same, "left").select("queue", "backup", "time", "t", (F.col("t") - enqueued)
                                                  .alias("lag_us"))


def percentiles(column: str, prefix: str) -> list[Column]:
    """Aggregates: p50/p95/p99 and max, in milliseconds. Exact nearest rank: of n values, pX is the one at rank
    ceil(X/100 * n) in ascending order (an observed value). Spark's percentile_disc computes it (checked against
    that definition by tests/audit/test_report.py) from a count per distinct value of the group, so its memory
    grows with the distinct values (µs of lag: tens of thousands), not with the rows; it works in a stream too. The
    batch audit computes the same statistic from plain counts (ranks.py), with less CPU (bench/RESULTS.md)."""
    ranks = ", ".join(str(p) for p in PERCENTILES)
    ranked = F.expr(f"percentile_disc(array({ranks})) WITHIN GROUP (ORDER BY `{column}`)")
    return [*(F.round(ranked[i] / 1000.0, 3).alias(f"{prefix}_p{int(p * 100)}_ms") for i, p in enumerate(PERCENTILES)),
            F.round(F.max(column) / 1000.0, 3).alias(f"{prefix}_max_ms")]


def absent_copies(completes: DataFrame, replicas: DataFrame, dequeues: DataFrame,
                  bound: timedelta = DEFAULT_BOUND) -> DataFrame:
    """Confirmations whose copy a backup lacks: one row (queue, uid, seq, message_id, time and t of the
    confirmation, backup) per backup a `complete` names (it was caught up with the queue then) that logged
    no copy of the message from COPY_HORIZON before the confirmation to `bound` after it. A message
    the primary dequeued before confirming it needs no copy.

    completes: the primaries' `complete` events; replicas: `replicate` events with the receiving
    broker as `backup`; dequeues: the primaries' `dequeue` events."""
    expected = completes.select("queue", "uid", "seq", "message_id", "time", "t", F.explode("backups").alias("backup"))
    # What shows a copy is not needed: the backup's copy, or a dequeue on the primary (no backup).
    copies = replicas.select("uid", "seq", "backup", "time")
    consumed = dequeues.select("uid", "seq", F.lit(None).cast("string").alias("backup"), "time")
    evidence = copies.unionByName(consumed).select(*(F.col(c).alias(f"ev_{c}") for c in ("uid", "seq", "backup",
                                                                                          "time")))
    covers = ((F.col("uid") == F.col("ev_uid")) & (F.col("seq") == F.col("ev_seq"))
              & (F.col("ev_time") >= F.col("time") - _seconds(COPY_HORIZON))
              & (F.col("ev_time") <= F.col("time") + _seconds(bound))
              & ((F.col("ev_backup") == F.col("backup"))
                 | (F.col("ev_backup").isNull() & (F.col("ev_time") < F.col("time")))))
    return expected.join(evidence, covers, "left").filter(F.col("ev_uid").isNull()).select(*expected.columns)


def missing(absent: DataFrame, marks: DataFrame, bound: timedelta = DEFAULT_BOUND) -> DataFrame:
    """The absent copies (absent_copies) of backups whose log shows a `mark` within `bound` after the
    confirmation: the log reached past it, and a copy logged before is in it, so the copy is missing.

    marks: the `mark` events (every broker marks at least once a second while it runs)."""
    return _marked(absent, marks, bound, "left_semi")


def unverified(absent: DataFrame, marks: DataFrame, bound: timedelta = DEFAULT_BOUND) -> DataFrame:
    """The other absent copies: the backup logged no mark within `bound` after the confirmation (it
    crashed and its log lost its tail), so it may have had the copy. A stream cannot tell these
    (no anti-join): only the batch job counts them."""
    return _marked(absent, marks, bound, "left_anti")


def _marked(absent: DataFrame, marks: DataFrame, bound: timedelta, how: str) -> DataFrame:
    witnesses = marks.select(F.col("broker").alias("mark_broker"), F.col("time").alias("mark_time"))
    covered = ((F.col("backup") == F.col("mark_broker")) & (F.col("mark_time") >= F.col("time"))
               & (F.col("mark_time") <= F.col("time") + _seconds(bound)))
    return absent.join(witnesses, covered, how)
