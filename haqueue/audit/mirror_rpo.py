"""The mirror's recovery point (design/audit-events.md, "The mirror's recovery point"): `haqueue audit lag
--standby-events DIR` joins what the source cluster confirmed with what the standby cluster applied, per mirrored
queue and message id.

It needs no event of its own. The source's primary logs a `complete` for each message it confirmed, and its
`enqueue` and `dequeue`; the standby's primary logs an `enqueue` for each message its mirror applies (the mirror
enqueues it as a publish would, design/mirroring.md), under the queue's name and with the message's id (the mirror
sends the message as the source holds it), and no `complete`: no client published it. (A client's publish to the
queue after a promotion has its `complete`, and is not taken for the mirror's.) A queue is taken for mirrored when
the standby applied a message of it that the source logged.

A confirmed message is at risk of a site loss from its confirmation until the standby applied it, or the source
dequeued it (consumed there: the loss of the site then costs nothing of it), or else until the end of the source's
log. Those still at risk at that end are the `unmirrored`: what the source's loss at the end of its log cost, the
recovery point in messages; the longest a message was at risk is the recovery point in seconds (`rpo_max_s`), and
the most at risk at once `rpo_max_messages`. The timeline samples both at its buckets' starts.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from haqueue.audit import measures, schema

UNMIRRORED, DUPLICATE = "unmirrored", "duplicate"
QUEUE_COLUMNS: list[str] = ["queue", "confirmed", "applied", "unmirrored", "rpo_max_messages", "rpo_max_s",
                            "duplicates", "lag_p50_ms", "lag_p95_ms", "lag_p99_ms", "lag_max_ms"]
_COUNTS = ["confirmed", "applied", "unmirrored", "rpo_max_messages", "duplicates"]
TIMELINE_COLUMNS: list[str] = ["queue", "time", "unmirrored", "age_s"]


@dataclass
class MirrorAudit:
    """Per mirrored queue (`queues`), the recovery point over time (`timeline`: queue, time, unmirrored, age_s) and
    each message behind a count (`problems`: problem, queue, message_id, time); `rpo_limit`: --mirror-rpo-max."""

    queues: pd.DataFrame
    timeline: pd.DataFrame
    problems: pd.DataFrame
    rpo_limit: float | None = None

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {"mirror": self.queues, "mirror_timeline": self.timeline, "mirror_problems": self.problems}

    @property
    def unmirrored(self) -> int:
        return int(self.queues["unmirrored"].sum()) if len(self.queues) else 0

    @property
    def over_limit(self) -> pd.DataFrame:
        """The queues whose recovery point in seconds passed --mirror-rpo-max (none without it)."""
        if self.rpo_limit is None:
            return self.queues.iloc[0:0]
        return self.queues[self.queues["rpo_max_s"] > self.rpo_limit]


def analyse_mirror(source: DataFrame, standby: DataFrame, bucket_us: int, detail_limit: int,
                   rpo_limit: float | None = None) -> MirrorAudit:
    """source, standby: each cluster's usable events (schema.FIELDS); bucket_us: the timeline's bucket; detail_limit:
    rows of the problems table."""
    primary = F.col("role") != schema.BACKUP
    last = source.agg(F.max("t")).first()
    end = last[0] if last is not None else None  # the end of the source's log (its marks included)
    if end is None:
        return MirrorAudit(_queue_table(None, None, None), _timeline(None), _problems(None, detail_limit), rpo_limit)

    def first(kind: str) -> Column:
        return F.min(F.when(F.col("event") == kind, F.col("t")))
    at_source = (source.filter(primary & F.col("message_id").isNotNull())
                 .groupBy("queue", "message_id")
                 .agg(first(schema.COMPLETE).alias("confirmed_t"), first(schema.ENQUEUE).alias("enqueued_t"),
                      first(schema.DEQUEUE).alias("dequeued_t"),
                      F.countDistinct(F.when(F.col("event") == schema.ENQUEUE,
                                             F.concat_ws("/", "uid", F.col("seq").cast("string")))).alias("copies")))
    logged = standby.filter(primary & F.col("queue").isNotNull())
    published = logged.filter(F.col("event") == schema.COMPLETE).select("uid", "seq")  # by a client, not the mirror
    applied = (logged.filter((F.col("event") == schema.ENQUEUE) & F.col("message_id").isNotNull())
               .join(published, ["uid", "seq"], "left_anti")
               .groupBy("queue", "message_id").agg(F.min("t").alias("applied_t"), F.count("*").alias("applies")))
    both = at_source.join(applied, ["queue", "message_id"], "left")
    mirrored = both.filter(F.col("applied_t").isNotNull()).select("queue").distinct()
    safe = F.least("applied_t", "dequeued_t")  # null while neither happened
    rows = (both.join(F.broadcast(mirrored), "queue", "left_semi")
            .withColumn("safe_t", safe)
            .withColumn("exposed_us", F.when(F.col("confirmed_t").isNotNull(),
                                             F.greatest(F.coalesce("safe_t", F.lit(end)) - F.col("confirmed_t"),
                                                        F.lit(0))))
            .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        return MirrorAudit(_queue_table(_counts(rows), _peaks(rows), _lags(rows)), _timeline(rows, end, bucket_us),
                           _problems(rows, detail_limit), rpo_limit)
    finally:
        rows.unpersist()


def _unmirrored() -> Column:
    return F.col("confirmed_t").isNotNull() & F.col("safe_t").isNull()


def _duplicated() -> Column:
    """Applied on the standby more often than the source enqueued that message id on the queue."""
    return F.coalesce(F.col("applies") > F.greatest("copies", F.lit(1)), F.lit(False))


def _counts(rows: DataFrame) -> pd.DataFrame:
    return (rows.groupBy("queue")
            .agg(F.count("confirmed_t").alias("confirmed"), F.count("applied_t").alias("applied"),
                 F.sum(_unmirrored().cast("int")).alias("unmirrored"),
                 F.round(F.max("exposed_us") / 1e6, 3).alias("rpo_max_s"),
                 F.sum(_duplicated().cast("int")).alias("duplicates"))
            .toPandas())


def _exposed(rows: DataFrame) -> DataFrame:
    """The confirmed messages that were ever at risk: not applied nor dequeued by their confirmation."""
    return rows.filter(F.col("exposed_us") > 0)


def _peaks(rows: DataFrame) -> pd.DataFrame:
    """The most messages at risk at once per queue: +1 at each confirmation, -1 once safe, summed in time order
    (at one instant the ends first)."""
    exposed = _exposed(rows)
    starts = exposed.select("queue", F.col("confirmed_t").alias("t"), F.lit(1).alias("delta"))
    ends = exposed.filter(F.col("safe_t").isNotNull()).select("queue", F.col("safe_t").alias("t"),
                                                              F.lit(-1).alias("delta"))
    changes = starts.unionByName(ends)
    running = F.sum("delta").over(Window.partitionBy("queue").orderBy("t", "delta")
                                  .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return changes.withColumn("open", running).groupBy("queue").agg(F.max("open").alias("rpo_max_messages")).toPandas()


def _lags(rows: DataFrame) -> pd.DataFrame:
    """The mirror's lag per queue: the standby's apply minus the source's enqueue, of each message applied."""
    return (rows.filter(F.col("applied_t").isNotNull() & F.col("enqueued_t").isNotNull())
            .withColumn("lag_us", F.col("applied_t") - F.col("enqueued_t"))
            .groupBy("queue").agg(*measures.percentiles("lag_us", "lag")).toPandas())


def _queue_table(counts: pd.DataFrame | None, peaks: pd.DataFrame | None, lags: pd.DataFrame | None) -> pd.DataFrame:
    if counts is None or counts.empty:
        return pd.DataFrame(columns=QUEUE_COLUMNS).astype({c: "int64" for c in _COUNTS})
    table = counts.merge(peaks, on="queue", how="left").merge(lags, on="queue", how="left")
    table[_COUNTS] = table[_COUNTS].fillna(0).astype("int64")
    table["rpo_max_s"] = table["rpo_max_s"].fillna(0.0)
    return table[QUEUE_COLUMNS].sort_values("queue", ignore_index=True)


def _timeline(rows: DataFrame | None, end: int = 0, bucket_us: int = 1) -> pd.DataFrame:
    """At each bucket's start: the messages at risk on each queue and how long the oldest of them had been (buckets
    with none are left out). Rows of the buckets' number, whatever the messages at risk: the count is a running sum
    of +1 at each confirmation's first bucket start and -1 at its end's; the age is that of the oldest open message,
    which message i is from when it and every earlier one (in confirmation order) is open, max(its confirmation,
    the latest end of the earlier), to its own end: those spans never overlap."""
    if rows is None:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    exposed = _exposed(rows).withColumn("stop", F.coalesce(F.col("safe_t"), F.lit(end + 1)))

    def start_at_or_after(t: Column) -> Column:
        return F.ceil(t / bucket_us).cast("long") * bucket_us
    changes: pd.DataFrame = (
        exposed.select("queue", start_at_or_after(F.col("confirmed_t")).alias("at"), F.lit(1).alias("delta"))
        .unionByName(exposed.select("queue", start_at_or_after(F.col("stop")).alias("at"), F.lit(-1).alias("delta")))
        .groupBy("queue", "at").agg(F.sum("delta").alias("delta")).toPandas())
    earlier = Window.partitionBy("queue").orderBy("confirmed_t", "stop").rowsBetween(Window.unboundedPreceding, -1)
    oldest = exposed.withColumn("since", F.greatest("confirmed_t", F.coalesce(F.max("stop").over(earlier), F.lit(0))))
    first = start_at_or_after(F.col("since"))
    last = F.floor((F.col("stop") - 1) / bucket_us).cast("long") * bucket_us
    samples = F.explode(F.sequence(first, last, F.lit(bucket_us))).alias("at")
    ages: pd.DataFrame = (oldest.filter(first <= last).select("queue", "confirmed_t", samples)
                          .select("queue", "at", F.timestamp_micros("at").alias("time"),
                                  F.round((F.col("at") - F.col("confirmed_t")) / 1e6, 3).alias("age_s"))
                          .toPandas())
    if ages.empty:
        return pd.DataFrame(columns=TIMELINE_COLUMNS)
    changes = changes.sort_values(["queue", "at"], ignore_index=True)
    changes["unmirrored"] = changes.groupby("queue")["delta"].cumsum()
    timeline = pd.merge_asof(ages.sort_values("at"), changes[["queue", "at", "unmirrored"]].sort_values("at"),
                             on="at", by="queue")  # the count as of each sample: the latest change at or before it
    return timeline[TIMELINE_COLUMNS].sort_values(["queue", "time"], ignore_index=True)


def _problems(rows: DataFrame | None, limit: int) -> pd.DataFrame:
    """Each message confirmed at the source and never made safe (unmirrored), and each applied more often than the
    source had it (duplicate)."""
    if rows is None:
        return pd.DataFrame(columns=["problem", "queue", "message_id", "time"])
    unmirrored = rows.filter(_unmirrored()).select(F.lit(UNMIRRORED).alias("problem"), "queue", "message_id",
                                                       F.col("confirmed_t").alias("t"))
    duplicates = rows.filter(_duplicated()).select(F.lit(DUPLICATE).alias("problem"), "queue", "message_id",
                                                       F.col("applied_t").alias("t"))
    return (unmirrored.unionByName(duplicates).orderBy("problem", "queue", "t").limit(limit)
            .select("problem", "queue", "message_id", F.timestamp_micros("t").alias("time")).toPandas())
