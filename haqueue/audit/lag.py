"""The replication audit as a PySpark job: `haqueue audit lag` (design/audit-events.md).

Reads every `*.jsonl` file under the events directory and answers, per queue and per backup:
how far behind the backup ran (lag: its receive time minus the primary's enqueue time), which
confirmed messages never reached a backup that was ready, which reached it twice, which arrived
out of order, and which dequeues it never applied; per queue, which messages were confirmed while
fewer than a majority of the cluster held them (at risk) and which a rejoining broker kept aside
because the new primary never had them (diverged if confirmed as replicated, else kept aside). Only Spark SQL functions are used (no Python
UDFs), so executors need PySpark alone; the driver collects the small result tables.

Run locally (`local[*]`) by default; on a cluster through spark-submit (submit.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping, Sequence

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from haqueue.audit import measures, schema
from haqueue.audit.exits import EXIT_CANNOT_TELL, EXIT_LOSS, EXIT_OK, UsageError
from haqueue.audit.progress import Progress
from haqueue.audit.sources import read_events, read_ledgers, session, tune_for
from haqueue.audit.storage import Storage, uri

# A primary's dequeue counts as not mirrored on a backup only if that backup kept logging at least
# this long afterwards (µs): otherwise its log may just have ended first (crash, or still running).
MIRROR_GRACE_US = 1_000_000
DETAIL_LIMIT = 100_000  # rows of the problems table (each missing, duplicate... message)
TIMELINE_POINTS = 300  # about this many time buckets per backup in the lag chart
# Bucket widths to choose from (µs): the smallest that keeps the chart near TIMELINE_POINTS.
_BUCKETS_US = [n * unit for unit in (1_000, 1_000_000) for n in (1, 2, 5, 10, 20, 50, 100, 200, 500)] + \
    [n * 60_000_000 for n in (1, 2, 5, 10, 30, 60, 120, 360, 720, 1440)]


@dataclass
class Audit:
    """What the job found; each table a pandas DataFrame (report.py writes and prints them)."""

    totals: dict[str, Any]
    queues: pd.DataFrame
    backups: pd.DataFrame
    epochs: pd.DataFrame
    timeline: pd.DataFrame
    problems: pd.DataFrame
    bad_input: pd.DataFrame
    # Per queue, from the clients' ledgers (empty without --ledger), and one row per message behind a count.
    ledgers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LEDGER_COLUMNS))
    ledger_problems: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LEDGER_PROBLEM_COLUMNS))
    # Per shard of a sharded cluster: the queues' and backups' figures added up (empty without shards).
    shards: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SHARD_COLUMNS))

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {"queues": self.queues, "backups": self.backups, "epochs": self.epochs,
                "lag_timeline": self.timeline, "problems": self.problems, "bad_input": self.bad_input,
                "ledgers": self.ledgers, "ledger_problems": self.ledger_problems, "shards": self.shards}

    @property
    def missing(self) -> int:
        return _total(self.backups, "missing")

    @property
    def unattested(self) -> int:
        return _total(self.queues, "unattested")

    @property
    def at_risk(self) -> int:
        return _total(self.queues, "at_risk")

    @property
    def diverged(self) -> int:
        return _total(self.queues, "diverged")

    @property
    def kept_aside(self) -> int:
        return _total(self.queues, "kept_aside")

    @property
    def lost(self) -> int:
        return _total(self.ledgers, "lost")


def _total(table: pd.DataFrame, column: str) -> int:
    return int(table[column].sum()) if len(table) else 0


# ---- the analysis ------------------------------------------------------------------------------

def analyse(spark: SparkSession, directory: str, since: int | None = None, until: int | None = None,
            ledgers: Sequence[str] = (), bound: timedelta = measures.DEFAULT_BOUND, tune: bool = True) -> Audit:
    """The whole audit of the events under `directory` (a path or a URI, storage.py); since/until (µs) bound
    the events judged (the ledgers, if any, are judged whole); `bound`: how long after a confirmation a
    copy may come (measures.absent_copies); `tune`: size the session for the events (sources.tune_for)
    first, unless the caller has."""
    if tune:
        tune_for(spark, Storage(spark).event_files(directory).bytes)
    events, bad = read_events(spark, uri(directory))
    events = measures.timed(events).withColumn("judged", _window(F.col("t"), since, until)).persist()
    try:
        audit = _analyse(events, bad, bound)
        if ledgers:
            entries, bad_entries = read_ledgers(spark, [uri(path) for path in ledgers])
            audit.ledgers, audit.ledger_problems = _ledger_tables(events, entries)
            audit.bad_input = pd.concat([audit.bad_input, _bad_table(bad_entries)], ignore_index=True)
            audit.totals["bad_lines"] = int(audit.bad_input["lines"].sum())
        return audit
    finally:
        events.unpersist()


def _window(t: Column, since: int | None, until: int | None) -> Column:
    judged = F.lit(True)
    if since is not None:
        judged = judged & (t >= since)
    if until is not None:
        judged = judged & (t < until)
    return judged


def _analyse(ev: DataFrame, bad: DataFrame, bound: timedelta) -> Audit:
    primary_side = ev.filter(F.col("role") != schema.BACKUP)
    enqueues = primary_side.filter(F.col("event") == schema.ENQUEUE)
    # Confirmations of replicated messages: one kept off the backups (`replicated` false) needs no copy anywhere.
    completes = primary_side.filter((F.col("event") == schema.COMPLETE) & F.coalesce(F.col("replicated"), F.lit(True)))
    dequeues = primary_side.filter(F.col("event") == schema.DEQUEUE)
    replicas = (ev.filter(F.col("event") == schema.REPLICATE)
                .withColumnRenamed("broker", "backup"))
    mirrored = (ev.filter((F.col("event") == schema.DEQUEUE) & (F.col("role") == schema.BACKUP))
                .select("uid", "seq", F.col("broker").alias("backup"), "run"))
    aside = ev.filter((F.col("event") == schema.DIVERGED) & F.col("judged")).withColumnRenamed("broker", "backup")
    # Kept aside and confirmed as replicated (a complete is logged before its confirmation leaves, so a killed
    # primary's log lacks none): diverged. The rest its publisher was never told were safe: kept aside alone.
    confirmed = completes.select("uid", "seq").distinct()
    diverged = aside.join(confirmed, ["uid", "seq"], "left_semi")
    kept_aside = aside.join(confirmed, ["uid", "seq"], "left_anti")
    runs = ev.groupBy("broker", "run").agg(F.min("t").alias("start"), F.max("t").alias("end"))
    # Where and when each message was first enqueued (a message keeps its uid and seq everywhere).
    origin = enqueues.groupBy("uid", "seq").agg(F.min("t").alias("t_enq"), F.min("epoch").alias("enq_epoch"))

    marks = ev.filter(F.col("event") == schema.MARK)

    totals = _totals(ev)
    lag = measures.live_lag(replicas.filter(F.col("judged")), enqueues)
    unattested = _unattested(primary_side, replicas).persist()
    problems = (_problems(completes, dequeues, replicas, mirrored, runs, marks, bound)
                .unionByName(_as_problem(unattested, UNATTESTED, "t"))
                .unionByName(_as_problem(_at_risk(completes, replicas, marks), AT_RISK, "t"))
                .unionByName(_as_problem(diverged, DIVERGED, "t"))
                .unionByName(_as_problem(kept_aside, KEPT_ASIDE, "t"))).persist()
    try:
        counts = problems.groupBy("queue", "backup", "problem").agg(F.sum("weight").alias("n")).toPandas()
        detail = (problems.orderBy("problem", "queue", "seq", "backup").limit(DETAIL_LIMIT)
                  .select("problem", "queue", "seq", "message_id", "backup", F.timestamp_micros("t").alias("time"))
                  .toPandas())
        unattested_by_epoch = unattested.groupBy("epoch").agg(F.count("*").alias("unattested")).toPandas()
    finally:
        problems.unpersist()
        unattested.unpersist()
    backups = _backup_table(_per_backup(replicas, lag), _pivot(counts, ["queue", "backup"], _COUNT_COLUMNS))
    bad_input = _bad_table(bad)
    totals["bad_lines"] = int(bad_input["lines"].sum())
    queues = _queue_table(primary_side, completes, origin, backups, _pivot(counts, ["queue"], _QUEUE_COUNT_COLUMNS))
    return Audit(totals=totals, queues=queues,
                 backups=backups, epochs=_epochs(primary_side, dequeues, origin, unattested_by_epoch),
                 timeline=_timeline(lag, totals), problems=detail, bad_input=bad_input,
                 shards=_shard_table(ev, primary_side, lag, backups))


def _bad_table(bad: DataFrame) -> pd.DataFrame:
    table = (bad.groupBy("file", "problem").agg(F.count("*").alias("lines"), F.first("line").alias("example"))
             .orderBy("file", "problem").toPandas())
    table["example"] = table["example"].str.slice(0, 200)
    return table


def _per_backup(replicas: DataFrame, lag: DataFrame) -> DataFrame:
    judged = replicas.filter(F.col("judged"))
    counts = judged.groupBy("queue", "backup").agg(
        F.count("*").alias("received"),
        F.sum((F.col("mode") == schema.LIVE).cast("int")).alias("live"),
        F.sum((F.col("mode") == schema.CATCHUP).cast("int")).alias("catchup"))
    stats = lag.groupBy("queue", "backup").agg(*measures.percentiles("lag_us", "lag"))
    return counts.join(stats, ["queue", "backup"], "left")


# The problems table: one row per message and backup behind a count; weight is what it adds to it.
_PROBLEM_COLUMNS = ("problem", "queue", "seq", "message_id", "backup", "t", "weight")
MISSING, UNVERIFIED, DUPLICATE, OUT_OF_ORDER, NOT_MIRRORED, UNATTESTED, AT_RISK, DIVERGED, KEPT_ASIDE = (
    "missing", "unverified", "duplicate", "out of order", "dequeue not mirrored", "unattested", "at risk", "diverged",
    "kept aside")
# Problem -> its column in the backups table (and summed per queue), and in the queues table alone.
_COUNT_COLUMNS = {MISSING: "missing", UNVERIFIED: "unverified", DUPLICATE: "duplicates",
                  OUT_OF_ORDER: "order_violations", NOT_MIRRORED: "dequeues_not_mirrored"}
_QUEUE_COUNT_COLUMNS = {UNATTESTED: "unattested", AT_RISK: "at_risk", DIVERGED: "diverged", KEPT_ASIDE: "kept_aside"}


def _problems(completes: DataFrame, dequeues: DataFrame, replicas: DataFrame, mirrored: DataFrame,
              runs: DataFrame, marks: DataFrame, bound: timedelta) -> DataFrame:
    absent = measures.absent_copies(completes.filter(F.col("judged")), replicas, dequeues, bound)
    frames = [_as_problem(measures.missing(absent, marks, bound), MISSING, "t"),
              _as_problem(measures.unverified(absent, marks, bound), UNVERIFIED, "t"),
              _as_problem(_duplicates(replicas), DUPLICATE, "t", F.col("copies") - 1),
              _as_problem(_order_violations(replicas), OUT_OF_ORDER, "t"),
              _as_problem(_unmirrored(dequeues, replicas, mirrored, runs), NOT_MIRRORED, "t_deq")]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _as_problem(frame: DataFrame, problem: str, time: str, weight: Column | None = None) -> DataFrame:
    return frame.select(F.lit(problem).alias("problem"), "queue", "seq", "message_id", "backup",
                        F.col(time).alias("t"), (weight if weight is not None else F.lit(1)).alias("weight"))


def _pivot(counts: pd.DataFrame, index: list[str], columns: dict[str, str]) -> pd.DataFrame:
    """The counts (index..., problem, n) of the problems in `columns`, a column each under its name there."""
    chosen = counts[counts["problem"].isin(list(columns))]
    return (chosen.pivot_table(index=index, columns="problem", values="n", aggfunc="sum")
            .rename(columns=columns).reindex(columns=list(columns.values())))


def _at_risk(completes: DataFrame, replicas: DataFrame, marks: DataFrame) -> DataFrame:
    """Confirmations made while fewer than a majority of the cluster held the message: the primary, the
    backups its `complete` names and those that logged a copy before it (_unnamed_holders) are fewer than
    cluster_size // 2 + 1, the size its run's marks give (a run whose marks give none, a log older than the
    field, is not judged). What the floor forbids unless opted out of (ha.min_confirmations: 1): a partition
    can lose such a message."""
    sizes = (marks.filter(F.col("cluster_size").isNotNull()).groupBy("broker", "run")
             .agg(F.max("cluster_size").alias("cluster_size")))
    majority = F.floor(F.col("cluster_size") / 2) + 1
    short = (completes.filter(F.col("judged")).drop("cluster_size").join(F.broadcast(sizes), ["broker", "run"])
             .filter(F.size("backups") + 1 < majority))
    holders = F.size("backups") + 1 + F.coalesce(F.col("unnamed"), F.lit(0))
    return (short.join(_unnamed_holders(short, replicas), ["uid", "seq"], "left").filter(holders < majority)
            .withColumn("backup", F.lit(None).cast("string")))


def _unnamed_holders(confirmations: DataFrame, replicas: DataFrame) -> DataFrame:
    """(uid, seq, unnamed): how many backups a confirmation does not name had logged a copy of its message
    before it. A backup still catching up on the queue votes for the live copies it settles, so the floor can
    count it before it is ready, and a `complete` names only the ready ones."""
    copies = replicas.select("uid", "seq", F.col("backup").alias("holder"), F.col("t").alias("copy_t"))
    return (confirmations.select("uid", "seq", "t", "backups", F.col("broker").alias("primary"))
            .join(copies, ["uid", "seq"])
            .filter((F.col("copy_t") <= F.col("t")) & (F.col("holder") != F.col("primary"))
                    & ~F.array_contains("backups", F.col("holder")))
            .groupBy("uid", "seq").agg(F.countDistinct("holder").alias("unnamed")))


def _unattested(primary_side: DataFrame, replicas: DataFrame) -> DataFrame:
    """Messages backups hold that no primary's log records (no enqueue, no confirmation): the log of the
    primary that sent them lost its tail (a machine crash), so what happened to them there is unknown.
    One row per message, under the epoch of its first replica; judged if any replica is."""
    attested = (primary_side.filter(F.col("event").isin(schema.ENQUEUE, schema.COMPLETE))
                .select("uid", "seq").distinct())
    held = replicas.groupBy("queue", "uid", "seq").agg(
        F.min("epoch").alias("epoch"), F.min("t").alias("t"), F.first("message_id").alias("message_id"),
        F.max(F.col("judged").cast("int")).alias("judged"))
    return (held.filter(F.col("judged") == 1).join(attested, ["uid", "seq"], "left_anti")
            .withColumn("backup", F.lit(None).cast("string")))


def _unmirrored(dequeues: DataFrame, replicas: DataFrame, mirrored: DataFrame, runs: DataFrame) -> DataFrame:
    """Messages dequeued on a primary that a backup holding them never removed (while it kept logging)."""
    holders = replicas.select("uid", "seq", "backup", "run").distinct()
    gone = dequeues.filter(F.col("judged")).select("uid", "seq", "queue", "message_id",
                                                   F.col("broker").alias("primary"), F.col("t").alias("t_deq"))
    expected = (gone.join(holders, ["uid", "seq"])
                .filter(F.col("backup") != F.col("primary"))  # a promoted backup consuming its own copy
                .join(F.broadcast(runs.select(F.col("broker").alias("backup"), "run", "end")), ["backup", "run"])
                .filter(F.col("end") >= F.col("t_deq") + MIRROR_GRACE_US))
    return expected.join(mirrored, ["uid", "seq", "backup", "run"], "left_anti")


def _order_violations(replicas: DataFrame) -> DataFrame:
    """Live replicas that arrived after a higher seq of the same queue (in one backup process)."""
    live = replicas.filter(F.col("mode") == schema.LIVE)
    previous = F.lag("seq").over(Window.partitionBy("backup", "run", "uid").orderBy("n"))
    return (live.withColumn("previous_seq", previous)
            .filter(F.col("judged") & (F.col("seq") < F.col("previous_seq"))))


def _duplicates(replicas: DataFrame) -> DataFrame:
    """Messages a backup process received more than once."""
    return (replicas.groupBy("queue", "backup", "run", "uid", "seq")
            .agg(F.count("*").alias("copies"), F.first("message_id").alias("message_id"),
                 F.max(F.col("judged").cast("int")).alias("judged"), F.max("t").alias("t"))
            .filter((F.col("copies") > 1) & (F.col("judged") == 1)))


def _event_counts() -> list[Column]:
    """Aggregates: how many enqueue, complete and dequeue events (as enqueued, completed, dequeued)."""
    return [F.sum((F.col("event") == kind).cast("int")).alias(name) for kind, name in
            ((schema.ENQUEUE, "enqueued"), (schema.COMPLETE, "completed"), (schema.DEQUEUE, "dequeued"))]


def _backup_table(per_backup: DataFrame, counts: pd.DataFrame) -> pd.DataFrame:
    result = per_backup.toPandas().merge(counts, left_on=["queue", "backup"], right_index=True, how="outer")
    numbers = ["received", "live", "catchup", *_COUNT_COLUMNS.values()]
    result[numbers] = result[numbers].fillna(0).astype("int64")
    columns = ["queue", "backup", "received", "live", "catchup", "lag_p50_ms", "lag_p95_ms", "lag_p99_ms",
               "lag_max_ms", "missing", "unverified", "duplicates", "order_violations", "dequeues_not_mirrored"]
    return result[columns].sort_values(["queue", "backup"], ignore_index=True)


def _queue_table(primary_side: DataFrame, completes: DataFrame, origin: DataFrame,
                 backups: pd.DataFrame, queue_counts: pd.DataFrame) -> pd.DataFrame:
    judged = primary_side.filter(F.col("judged"))
    counts = judged.groupBy("queue").agg(*_event_counts())
    latency = (completes.filter(F.col("judged")).join(origin, ["uid", "seq"])
               .withColumn("completion_us", F.col("t") - F.col("t_enq"))
               .groupBy("queue").agg(*measures.percentiles("completion_us", "completion")))
    result = counts.filter(F.col("queue").isNotNull()).join(latency, "queue", "left").toPandas()
    sums = backups.groupby("queue")[list(_COUNT_COLUMNS.values())].sum()
    result = result.merge(sums, left_on="queue", right_index=True, how="outer")
    result = result.merge(queue_counts, left_on="queue", right_index=True, how="outer")
    result["backups"] = result["queue"].map(backups.groupby("queue")["backup"].nunique())
    numbers = ["enqueued", "completed", "dequeued", "backups", *_COUNT_COLUMNS.values(), *_QUEUE_COUNT_COLUMNS.values()]
    result[numbers] = result[numbers].fillna(0).astype("int64")
    return result[["queue", "enqueued", "completed", "dequeued", "completion_p50_ms", "completion_p95_ms",
                   "completion_p99_ms", "completion_max_ms", *numbers[3:]]].sort_values("queue", ignore_index=True)


SHARD_COLUMNS = ["shard", "queues", "enqueued", "completed", "dequeued", "backups", "received", "lag_p50_ms",
                 "lag_p95_ms", "lag_p99_ms", "lag_max_ms", *_COUNT_COLUMNS.values()]


def _shard_table(ev: DataFrame, primary_side: DataFrame, lag: DataFrame, backups: pd.DataFrame) -> pd.DataFrame:
    """Per shard of a sharded cluster (design/sharding.md): what its primaries logged, its backups' lag, and
    the backups table's counts added up. A backup process serves one shard, which its lines name; a queue's
    copies in other shards (step 4's forwarding queues) count where they are. Empty without shards."""
    owners = ev.filter(F.col("shard").isNotNull()).select(F.col("broker").alias("backup"), "shard").distinct()
    judged = primary_side.filter(F.col("judged") & F.col("shard").isNotNull() & F.col("queue").isNotNull())
    logged = judged.groupBy("shard").agg(F.countDistinct("queue").alias("queues"), *_event_counts()).toPandas()
    lags = lag.join(F.broadcast(owners), "backup").groupBy("shard").agg(*measures.percentiles("lag_us", "lag"))
    served = backups.merge(owners.toPandas(), on="backup").groupby("shard")
    counts = (served[["received", *_COUNT_COLUMNS.values()]].sum()
              .join(served["backup"].nunique().rename("backups")).reset_index())
    result = logged.merge(lags.toPandas(), on="shard", how="outer").merge(counts, on="shard", how="outer")
    numbers = ["queues", "enqueued", "completed", "dequeued", "backups", "received", *_COUNT_COLUMNS.values()]
    result = result.reindex(columns=SHARD_COLUMNS)
    result[["shard", *numbers]] = result[["shard", *numbers]].fillna(0).astype("int64")
    return result.sort_values("shard", ignore_index=True)


def _epochs(primary_side: DataFrame, dequeues: DataFrame, origin: DataFrame,
            unattested: pd.DataFrame) -> pd.DataFrame:
    """Each epoch's primary, how many messages it took over from earlier epochs and consumed, and how
    many its backups hold that its log does not record (an epoch whose primary left no event at all
    shows with no primary)."""
    judged = primary_side.filter(F.col("judged"))
    table = judged.groupBy("epoch", "broker").agg(
        F.timestamp_micros(F.min("t")).alias("first_event"), F.timestamp_micros(F.max("t")).alias("last_event"),
        *_event_counts())
    inherited = (dequeues.filter(F.col("judged")).join(origin, ["uid", "seq"])
                 .filter(F.col("enq_epoch") < F.col("epoch"))
                 .groupBy("epoch", "broker").agg(F.count("*").alias("inherited_dequeued")))
    result = (table.join(inherited, ["epoch", "broker"], "left").fillna(0, subset=["inherited_dequeued"])
              .withColumnRenamed("broker", "primary").toPandas())
    result = result.merge(unattested, on="epoch", how="outer")
    numbers = ["enqueued", "completed", "dequeued", "inherited_dequeued", "unattested"]
    result[numbers] = result[numbers].fillna(0).astype("int64")
    return result.sort_values(["epoch", "first_event"], ignore_index=True)


# ---- client ledgers ----------------------------------------------------------------------------

LEDGER_COLUMNS = ["queue", "confirmed", "received", "lost", "duplicated", "unexpected", "left_on_queue", "kept_local"]
LEDGER_PROBLEM_COLUMNS = ["problem", "queue", "id", "time"]
LOST, DUPLICATED, UNEXPECTED = "lost", "duplicated", "unexpected"


def _ledger_tables(ev: DataFrame, entries: DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per queue, what producers had confirmed and consumers received, judged against the events:
    lost (confirmed, never received, and not on the queue at the end), duplicated (received more
    than once), unexpected (received, never confirmed nor enqueued by any primary); (table, detail).
    A confirmed message its primary kept off the backups and that is gone is `kept_local`, not lost: it
    asked to live on that broker alone (x-replicate: false, or transient under x-replicate: durable)."""
    confirmed = (entries.filter(F.col("op") == schema.CONFIRMED).groupBy("queue", "id")
                 .agg(F.min("t").alias("t")))
    received = (entries.filter(F.col("op") == schema.RECEIVED).groupBy("queue", "id")
                .agg(F.count("*").alias("receipts"), F.min("t").alias("t")))
    at_end = _held_at_end(ev)
    sent = (ev.filter((F.col("role") != schema.BACKUP) & (F.col("event") == schema.ENQUEUE))
            .select("queue", F.col("message_id").alias("id")).distinct())
    local = (ev.filter((F.col("event") == schema.COMPLETE) & ~F.coalesce(F.col("replicated"), F.lit(True)))
             .select("queue", F.col("message_id").alias("id")).distinct())
    unreceived = confirmed.join(received.select("queue", "id"), ["queue", "id"], "left_anti")
    gone = unreceived.join(at_end, ["queue", "id"], "left_anti")
    kinds = {LOST: gone.join(local, ["queue", "id"], "left_anti"),
             "kept_local": gone.join(local, ["queue", "id"], "left_semi"),
             "left_on_queue": unreceived.join(at_end, ["queue", "id"], "left_semi"),
             DUPLICATED: received.filter(F.col("receipts") > 1),
             UNEXPECTED: (received.join(confirmed.select("queue", "id"), ["queue", "id"], "left_anti")
                          .join(sent, ["queue", "id"], "left_anti"))}
    frames = [confirmed.select("queue", F.lit("confirmed").alias("kind"), "id", "t"),
              received.select("queue", F.lit("received").alias("kind"), "id", "t"),
              *(frame.select("queue", F.lit(kind).alias("kind"), "id", "t") for kind, frame in kinds.items())]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    union = union.persist()
    try:
        counts = union.groupBy("queue", "kind").count().toPandas()
        if counts.empty:
            return pd.DataFrame(columns=LEDGER_COLUMNS), pd.DataFrame(columns=LEDGER_PROBLEM_COLUMNS)
        detail = (union.filter(F.col("kind").isin(LOST, DUPLICATED, UNEXPECTED)).orderBy("kind", "queue", "t")
                  .limit(DETAIL_LIMIT)
                  .select(F.col("kind").alias("problem"), "queue", "id", F.timestamp_micros("t").alias("time"))
                  .toPandas())
    finally:
        union.unpersist()
    table = counts.pivot_table(index="queue", columns="kind", values="count", aggfunc="sum")
    table = table.reindex(columns=LEDGER_COLUMNS[1:]).fillna(0).astype("int64").reset_index()
    return table[LEDGER_COLUMNS].sort_values("queue", ignore_index=True), detail[LEDGER_PROBLEM_COLUMNS]


def _held_at_end(ev: DataFrame) -> DataFrame:
    """(queue, id) of the messages on the last primary's queues when its log ends: what its last run
    enqueued as primary or received as a backup, less what it dequeued (or applied a dequeue of, or kept
    aside as diverged)."""
    last = (ev.filter(F.col("role") != schema.BACKUP)
            .orderBy(F.col("epoch").desc(), F.col("t").desc()).select("broker", "run").limit(1))
    mine = ev.join(F.broadcast(last), ["broker", "run"])
    held = mine.filter(F.col("event").isin(schema.ENQUEUE, schema.REPLICATE)).select("queue", "uid", "seq",
                                                                                    "message_id")
    gone = mine.filter(F.col("event").isin(schema.DEQUEUE, schema.DIVERGED)).select("uid", "seq")
    return (held.join(gone, ["uid", "seq"], "left_anti").filter(F.col("message_id").isNotNull())
            .select("queue", F.col("message_id").alias("id")).distinct())


def _timeline(lag: DataFrame, totals: dict[str, Any]) -> pd.DataFrame:
    """Lag per backup over time, in buckets sized to the span of the events (totals["bucket_ms"])."""
    span_us = (totals["last"] - totals["first"]) // pd.Timedelta(microseconds=1) if totals["events"] else 0
    bucket_us = next((b for b in _BUCKETS_US if span_us / b <= TIMELINE_POINTS), _BUCKETS_US[-1])
    totals["bucket_ms"] = bucket_us / 1000
    approx = F.percentile_approx("lag_us", [0.5, 0.99], 10_000)
    return (lag.filter(F.col("lag_us").isNotNull())
            .withColumn("bucket", (F.col("t") / bucket_us).cast("long") * bucket_us)
            .groupBy("backup", "bucket").agg(F.count("*").alias("messages"),
                                             F.round(approx[0] / 1000.0, 3).alias("lag_p50_ms"),
                                             F.round(approx[1] / 1000.0, 3).alias("lag_p99_ms"),
                                             F.round(F.max("lag_us") / 1000.0, 3).alias("lag_max_ms"))
            .select("backup", F.timestamp_micros("bucket").alias("time"), "messages", "lag_p50_ms", "lag_p99_ms",
                    "lag_max_ms")
            .orderBy("backup", "time").toPandas())


def _totals(ev: DataFrame) -> dict[str, Any]:
    row = ev.agg(F.count("*").alias("events"), F.countDistinct("broker").alias("brokers"),
                 F.timestamp_micros(F.min("t")).alias("first"), F.timestamp_micros(F.max("t")).alias("last"),
                 F.sum(F.col("judged").cast("int")).alias("judged")).first()
    return {"events": row["events"], "judged": row["judged"] or 0, "brokers": row["brokers"],
            "first": row["first"], "last": row["last"]}


# ---- the command -------------------------------------------------------------------------------

def run_audit(events: str, out: str, master: str | None, since: int | None, until: int | None,
              fail_on_loss: bool, ledgers: Sequence[str] = (), bound: timedelta = measures.DEFAULT_BOUND,
              conf: Mapping[str, str] | None = None, debug: bool = False) -> int:
    """`haqueue audit lag`: analyse, write the tables and the chart, print the summary; the exit code.
    Paths may be URIs (storage.py); UsageError when one is not there."""
    from haqueue.audit import report

    spark = session(master, conf, debug)
    try:
        storage = Storage(spark)
        if not storage.is_dir(events):
            raise UsageError(f"no such directory: {events}")
        absent = [path for path in ledgers if not storage.is_file(path)]
        if absent:
            raise UsageError(f"no such ledger file: {', '.join(absent)}")
        if storage.is_file(out):
            raise UsageError(f"--out is a file, not a directory: {out}")
        listing = storage.event_files(events)  # one listing: the progress line's and the tuning's
        tune_for(spark, listing.bytes, given=conf or {})
        with Progress(spark.sparkContext, f"{listing.files:,} event files, {listing.bytes / 1e6:,.1f} MB"):
            audit = analyse(spark, events, since, until, ledgers, bound, tune=False)
        storage.write(out, report.outputs(audit))
    finally:
        spark.stop()
    print(report.summary(audit))
    return exit_code(audit) if fail_on_loss else EXIT_OK


def exit_code(audit: Audit) -> int:
    """--fail-on-loss's answer: a confirmed message lost, missing, at risk or kept aside (diverged) is a loss; a
    message kept aside that was never confirmed as replicated is not (its publisher was not told it was safe)."""
    if audit.missing or audit.lost or audit.at_risk or audit.diverged:
        return EXIT_LOSS
    return EXIT_CANNOT_TELL if audit.unattested else EXIT_OK
