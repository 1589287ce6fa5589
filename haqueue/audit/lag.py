"""The replication audit as a PySpark job: `haqueue audit lag` (design/audit-events.md).

Reads every `*.jsonl` file under the events directory and answers, per queue and per backup:
how far behind the backup ran (lag: its receive time minus the primary's enqueue time), which
confirmed messages never reached a backup that was ready, which reached it twice, which arrived
out of order, and which dequeues it never applied; per queue, which messages were confirmed while
fewer than a majority of the cluster held them (at risk) and which a rejoining broker kept aside
because the new primary never had them (diverged if confirmed as replicated, else kept aside). The checks of
one message's events run on the messages facts.py cannot prove sound, a few on a healthy cluster; the
figures of the sound ones (lag, latency, inherited dequeues) are read off their facts.
Only Spark SQL functions are used (no Python UDFs), so executors need PySpark alone; the driver collects the
small result tables.

The command (session, paths, outputs, exit code) is lag_command.py's.
"""
from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Sequence

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from haqueue.audit import facts, measures, ranks, schema
from haqueue.audit.mirror_rpo import MirrorAudit, analyse_mirror
from haqueue.audit.sources import EventInput, read_events, read_ledgers, tune_for, unusable, usable
from haqueue.audit.storage import uri

# A primary's dequeue counts as not mirrored on a backup only if that backup kept logging at least
# this long afterwards (µs): otherwise its log may just have ended first (crash, or still running).
MIRROR_GRACE_US = 1_000_000
PROBLEMS_POOL = "audit-problems"  # the scheduler pool the problems' jobs run in
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
    # The mirror's recovery point, given the standby cluster's events too (mirror_rpo.py); else None.
    mirror: MirrorAudit | None = None

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {"queues": self.queues, "backups": self.backups, "epochs": self.epochs,
                "lag_timeline": self.timeline, "problems": self.problems, "bad_input": self.bad_input,
                "ledgers": self.ledgers, "ledger_problems": self.ledger_problems, "shards": self.shards,
                **(self.mirror.tables if self.mirror is not None else {})}

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
            ledgers: Sequence[str] = (), bound: timedelta = measures.DEFAULT_BOUND, prove: bool = True) -> Audit:
    """The whole audit of the events under `directory` (a path or a URI, storage.py), the session sized for
    them first (sources.tune_for); since/until (µs) bound the events judged (the ledgers, if any, are judged
    whole); `bound`: how long after a confirmation a copy may come (measures.absent_copies); prove: False judges
    every message by every check, not the suspects alone (_analyse)."""
    found = read_events(spark, uri(directory))
    tune_for(spark, found.size)
    return analyse_input(found, since, until, ledgers, bound, prove)


def analyse_input(found: EventInput, since: int | None, until: int | None, ledgers: Sequence[str],
                  bound: timedelta, prove: bool = True, standby: EventInput | None = None,
                  rpo_limit: float | None = None) -> Audit:
    """The audit of the lines read_events found. Each query reads the files it needs, the columns it needs:
    Parquet files cheaply, so they are read as often as queries need them; JSON lines, parsed once, are kept
    in memory (or on local disk) while the audit runs. standby: the events of a standby cluster the audited one
    mirrors to, for the mirror's recovery point (mirror_rpo.py; judged whole, as the ledgers); rpo_limit: its
    --mirror-rpo-max."""
    spark = found.lines.sparkSession
    # Uncompressed: building a cache costs half as much CPU (strings' dictionaries are worked out per batch and
    # rarely pay: the events' ids are unique), and it is only about 20 % larger (bench/RESULTS.md).
    spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")
    lines = found.lines.persist(StorageLevel.MEMORY_AND_DISK) if found.json_files else found.lines
    try:
        judged = _window(F.col("t"), since, until)
        counted = _summary(lines.withColumn("judged", judged))
        # Input without a bad line (the summary counts them) is read without checking each line again.
        checked = bool(counted["problem"].notna().any())
        events = measures.timed(usable(lines) if checked else lines.select(*schema.FIELDS)).withColumn("judged",
                                                                                                      judged)
        audit = _analyse(events, counted, unusable(lines) if checked else None, bound, prove)
        if ledgers:
            entries, bad_entries = read_ledgers(spark, [uri(path) for path in ledgers])
            audit.ledgers, audit.ledger_problems = _ledger_tables(events, entries)
            audit.bad_input = pd.concat([audit.bad_input, _bad_table(bad_entries)], ignore_index=True)
            audit.totals["bad_lines"] = int(audit.bad_input["lines"].sum())
        if standby is not None:
            audit.mirror = analyse_mirror(events, usable(standby.lines), int(audit.totals["bucket_ms"] * 1000),
                                          DETAIL_LIMIT, rpo_limit)
        return audit
    finally:
        lines.unpersist()


def _window(t: Column, since: int | None, until: int | None) -> Column:
    judged = F.lit(True)
    if since is not None:
        judged = judged & (t >= since)
    if until is not None:
        judged = judged & (t < until)
    return judged


@dataclass(frozen=True)
class _Kinds:
    """An event frame's events by kind, as the checks take them."""

    primary_side: DataFrame  # what primaries (and standalone brokers) logged
    enqueues: DataFrame
    completes: DataFrame  # confirmations of replicated messages: one kept off the backups needs no copy anywhere
    dequeues: DataFrame  # on a primary
    replicas: DataFrame  # copies received, the receiving broker as `backup`
    mirrored: DataFrame  # dequeues a backup applied: uid, seq, backup, run
    aside: DataFrame  # messages kept aside at a rejoin (judged), the broker as `backup`

    @classmethod
    def of(cls, ev: DataFrame) -> _Kinds:
        primary_side = ev.filter(F.col("role") != schema.BACKUP)
        return cls(
            primary_side=primary_side,
            enqueues=primary_side.filter(F.col("event") == schema.ENQUEUE),
            completes=primary_side.filter((F.col("event") == schema.COMPLETE)
                                          & F.coalesce(F.col("replicated"), F.lit(True))),
            dequeues=primary_side.filter(F.col("event") == schema.DEQUEUE),
            replicas=ev.filter(F.col("event") == schema.REPLICATE).withColumnRenamed("broker", "backup"),
            mirrored=(ev.filter((F.col("event") == schema.DEQUEUE) & (F.col("role") == schema.BACKUP))
                      .select("uid", "seq", F.col("broker").alias("backup"), "run")),
            aside=ev.filter((F.col("event") == schema.DIVERGED) & F.col("judged")).withColumnRenamed("broker",
                                                                                                     "backup"))


def _analyse(ev: DataFrame, counted: pd.DataFrame, bad: DataFrame | None, bound: timedelta,
             prove: bool = True) -> Audit:
    """The audit of the events `ev`, whose lines `counted` sums up (_summary), and of the lines that are not
    events, `bad` (None: there are none); prove: judge per message only the suspects (facts.py), else every
    message (the same answers, slower: what tests compare the suspects' answers with)."""
    spark = ev.sparkSession
    every = _Kinds.of(ev)
    # The counts, runs and sizes of the events, typed as their columns are (a bad line's nulls made some floats).
    summary = counted[counted["problem"].isna()].drop(columns="problem").astype(_EVENT_TYPES)
    totals = _totals(summary)
    runs = _small(spark, summary.groupby(["broker", "run"], as_index=False).agg(start=("first", "min"),
                                                                             end=("last", "max")),
                  "broker STRING, run BIGINT, start BIGINT, end BIGINT")
    sizes = _small(spark, summary[summary["cluster_size"].notna()].groupby(["broker", "run"], as_index=False)
                   ["cluster_size"].max(), "broker STRING, run BIGINT, cluster_size BIGINT")
    marks = ev.filter(F.col("event") == schema.MARK).select("broker", "time").persist()
    kept = [marks]  # persisted or checkpointed (_checkpoint): each is read by several queries
    try:
        # Queries run side by side where one does not need another's answer: one's planning on the driver and its
        # stages of a few tasks leave cores idle that another's tasks take (bench/RESULTS.md).
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="audit-query") as pool:
            # Copies out of order, judged over every copy (an order across messages), beside the facts.
            ordered = pool.submit(_checkpoint, _as_problem(_order_violations(every.replicas), OUT_OF_ORDER, "t"), kept)
            # The messages judged by the checks: the suspects, else every one.
            judged, proof = every, None
            brokers = sorted(summary["broker"].unique())
            if prove and len(brokers) <= facts.MAX_BROKERS:
                largest = summary["cluster_size"].max()
                proof = facts.prove(ev, brokers, None if pd.isna(largest) else int(largest), bound)
                suspect_events = _checkpoint(proof.events(ev), kept)
                judged = _Kinds.of(suspect_events)
            lag, completions, inherited = _measures(judged, proof)
            if not _sharded(summary).empty:  # read twice: by _lag_stats and by _shard_lags
                lag = lag.persist()
                kept.append(lag)
            lag_stats = pool.submit(_lag_stats, lag, _bucket(totals))
            latency = pool.submit(_latency, completions)
            inherited_counts = pool.submit(_inherited_counts, inherited)
            bad_input = pool.submit(_bad_table, bad) if bad is not None else None
            shard_lags = pool.submit(_shard_lags, summary, lag)
            # The problems, the largest of these queries, are planned and run in this thread meanwhile, their chain
            # of small jobs in a scheduler pool of their own (sources.SCHEDULER_MODE).
            order = ordered.result()
            with _scheduler_pool(spark, PROBLEMS_POOL):
                problems = (_problems(judged, order, runs, marks, bound, kept)
                            .unionByName(_as_problem(_unattested(judged.primary_side, judged.replicas), UNATTESTED,
                                                     "t", epoch="epoch"))
                            .unionByName(_as_problem(_at_risk(judged.completes, judged.replicas, sizes), AT_RISK, "t"))
                            .unionByName(_aside(judged.aside, judged.completes))).persist()
                kept.append(problems)
                counts, detail = _problem_tables(problems)
            lags, timeline = _lag_tables(lag_stats.result())
            latencies, inherited_found = latency.result(), inherited_counts.result()
            bad_table = bad_input.result() if bad_input is not None else _NO_BAD_LINES.copy()
        backups = _backup_table(summary, lags, _pivot(counts, ["queue", "backup"], _COUNT_COLUMNS))
        totals["bad_lines"] = int(bad_table["lines"].sum())
        queues = _queue_table(summary, latencies, backups, _pivot(counts, ["queue"], _QUEUE_COUNT_COLUMNS))
        unattested = counts[counts["problem"] == UNATTESTED].groupby("epoch", as_index=False)["n"].sum()
        epochs = _epochs(summary, inherited_found, unattested.astype("int64").rename(columns={"n": "unattested"}))
        return Audit(totals=totals, queues=queues, backups=backups, epochs=epochs, timeline=timeline,
                     problems=detail, bad_input=bad_table, shards=_shard_table(summary, shard_lags.result(), backups))
    finally:
        for frame in kept:
            _release(frame)
        if proof is not None:
            proof.unpersist()


@contextmanager
def _scheduler_pool(spark: SparkSession, pool: str) -> Iterator[None]:
    """The jobs this thread starts meanwhile run in the scheduler pool `pool`; then in the caller's again."""
    context, key = spark.sparkContext, "spark.scheduler.pool"
    caller = context.getLocalProperty(key)
    context.setLocalProperty(key, pool)
    try:
        yield
    finally:
        context.setLocalProperty(key, caller)  # type: ignore[arg-type]  # None unsets it


def _checkpoint(frame: DataFrame, kept: list[DataFrame]) -> DataFrame:
    """`frame` computed now and kept (serialized, spilling to disk) as a frame of its own, without its lineage: the
    queries built on it are planned without the events' reading and checks and the facts under it, which took the
    problems most of their planning (bench/RESULTS.md). Added to `kept` as soon as it is made, from whichever
    thread, so that the audit frees it (_release) even if another query fails before this one's answer is read."""
    checkpoint = frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
    kept.append(checkpoint)
    return checkpoint


def _release(frame: DataFrame) -> None:
    """Frees what a persisted or _checkpoint'ed frame keeps (unpersist leaves a checkpoint's blocks to the JVM's
    garbage collector)."""
    frame.unpersist()
    plan = frame._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def _small(spark: SparkSession, table: pd.DataFrame, ddl: str) -> DataFrame:
    """A small pandas table as a Spark frame. An empty one is made without rows: from a pandas table, PySpark
    would start Python workers for it (seconds, where Arrow hands over a non-empty one at once)."""
    if table.empty:
        return spark.createDataFrame(spark.sparkContext.emptyRDD(), ddl)
    return spark.createDataFrame(table, ddl)


def _measures(judged: _Kinds, proof: facts.Proof | None) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(lag, completions, inherited) of every message: measures.live_lag's rows; (queue, completion_us) of each
    confirmation in the window judged, from its message's first enqueue; (epoch, broker) of each dequeue in the
    window judged of a message first enqueued in an earlier epoch. By joins for the messages in `judged`, read
    off the facts for the sound ones of `proof`."""
    # Where and when each judged message was first enqueued (a message keeps its uid and seq everywhere).
    origin = judged.enqueues.groupBy("uid", "seq").agg(F.min("t").alias("t_enq"), F.min("epoch").alias("enq_epoch"))
    lag = measures.live_lag(judged.replicas.filter(F.col("judged")), judged.enqueues)
    completions = (judged.completes.filter(F.col("judged")).join(origin, ["uid", "seq"])
                   .select("queue", (F.col("t") - F.col("t_enq")).alias("completion_us")))
    inherited = (judged.dequeues.filter(F.col("judged")).join(origin, ["uid", "seq"])
                 .filter(F.col("enq_epoch") < F.col("epoch")).select("epoch", "broker"))
    if proof is None:
        return lag, completions, inherited
    return (lag.unionByName(proof.lags()), completions.unionByName(proof.completions()),
            inherited.unionByName(proof.inherited()))


# The columns of the summary (_summary): one row per distinct value of the keys, its events counted.
_SUMMARY_KEYS = ["broker", "run", "role", "epoch", "shard", "queue", "event", "mode", "judged"]
# The types of the summary's columns that an event always has, and a bad line may lack (its nulls make them floats).
_EVENT_TYPES = {"run": "int64", "epoch": "int64", "judged": "bool", "first": "int64", "last": "int64"}


def _summary(lines: DataFrame) -> pd.DataFrame:
    """How many events of each broker process, role, epoch, shard, queue, kind and mode, in the window judged or
    not, with their first and last times and (marks) the cluster's size: what the totals, the per-queue,
    per-epoch and per-shard counts and each process's span are added up from, in pandas; and how many lines of
    each `problem` (read_events) there are, the events' problem null. One aggregation of the lines: its rows
    are the brokers' processes times their queues, a few thousand."""
    summary = lines.groupBy(*_SUMMARY_KEYS, "problem").agg(
        F.count("*").alias("events"), F.min("t").alias("first"), F.max("t").alias("last"),
        F.max("cluster_size").alias("cluster_size"))
    return summary.toPandas()


def _event_counts(summary: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per `by`: how many enqueue, complete and dequeue events (as enqueued, completed, dequeued)."""
    counted = summary.assign(**{name: summary["events"].where(summary["event"] == kind, 0) for kind, name in
                                ((schema.ENQUEUE, "enqueued"), (schema.COMPLETE, "completed"),
                                 (schema.DEQUEUE, "dequeued"))})
    return counted.groupby(by, as_index=False)[["enqueued", "completed", "dequeued"]].sum()


def _judged_primary_side(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[(summary["role"] != schema.BACKUP) & summary["judged"]]


# The bad input table (_bad_table) of input without a bad line.
_NO_BAD_LINES = pd.DataFrame({"file": pd.Series(dtype=object), "problem": pd.Series(dtype=object),
                              "lines": pd.Series(dtype="int64"), "example": pd.Series(dtype=object)})


def _bad_table(bad: DataFrame) -> pd.DataFrame:
    table: pd.DataFrame = (bad.groupBy("file", "problem")
                           .agg(F.count("*").alias("lines"), F.min("line").alias("example"))
                           .orderBy("file", "problem").toPandas())
    table["example"] = table["example"].str.slice(0, 200)
    return table


# The problems table (_as_problem): one row per message and backup behind a count; weight is what it adds to it.
MISSING, UNVERIFIED, DUPLICATE, OUT_OF_ORDER, NOT_MIRRORED, UNATTESTED, AT_RISK, DIVERGED, KEPT_ASIDE = (
    "missing", "unverified", "duplicate", "out of order", "dequeue not mirrored", "unattested", "at risk", "diverged",
    "kept aside")
# Problem -> its column in the backups table (and summed per queue), and in the queues table alone.
_COUNT_COLUMNS = {MISSING: "missing", UNVERIFIED: "unverified", DUPLICATE: "duplicates",
                  OUT_OF_ORDER: "order_violations", NOT_MIRRORED: "dequeues_not_mirrored"}
_QUEUE_COUNT_COLUMNS = {UNATTESTED: "unattested", AT_RISK: "at_risk", DIVERGED: "diverged", KEPT_ASIDE: "kept_aside"}


def _problems(judged: _Kinds, order: DataFrame, runs: DataFrame, marks: DataFrame, bound: timedelta,
              kept: list[DataFrame]) -> DataFrame:
    """The problems found per backup: of the messages in `judged`, and `order`'s (the copies out of order, as
    problems); the frames it persists go to `kept`."""
    absent = measures.absent_copies(judged.completes.filter(F.col("judged")), judged.replicas, judged.dequeues,
                                    bound).persist()
    kept.append(absent)  # judged twice: missing and unverified
    frames = [_as_problem(measures.missing(absent, marks, bound), MISSING, "t"),
              _as_problem(measures.unverified(absent, marks, bound), UNVERIFIED, "t"),
              _as_problem(_duplicates(judged.replicas), DUPLICATE, "t", F.col("copies") - 1),
              order,
              _as_problem(_unmirrored(judged.dequeues, judged.replicas, judged.mirrored, runs), NOT_MIRRORED,
                          "t_deq")]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


_COUNTED = ["queue", "backup", "problem", "epoch"]  # the problems' counts (_problem_tables) are per these
_ORDER = ["problem", "queue", "seq", "backup"]  # the problems table's order
_DETAIL = ["problem", "queue", "seq", "message_id", "backup", "time"]  # and its columns


def _problem_tables(problems: DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the counts: `n`, the weights added up per _COUNTED; the problems table: the first DETAIL_LIMIT problems in
    _ORDER, nulls first as Spark orders them) of `problems` (_as_problem's rows). Up to DETAIL_LIMIT problems (a
    healthy cluster's handful) are collected in one query and both tables made of them here: a query of its own
    for each, the sort's too, was a fixed cost of every audit. More are counted and sorted by Spark."""
    detail_columns: list[Column | str] = [*_DETAIL[:-1], F.timestamp_micros("t").alias("time")]
    rows: pd.DataFrame = problems.select(*detail_columns, "weight", "epoch").limit(DETAIL_LIMIT + 1).toPandas()
    if len(rows) <= DETAIL_LIMIT:
        counts = rows.groupby(_COUNTED, dropna=False, as_index=False)["weight"].sum().rename(columns={"weight": "n"})
        detail = rows.sort_values(_ORDER, na_position="first", kind="stable", ignore_index=True)[_DETAIL]
        return counts, detail
    counts = problems.groupBy(*_COUNTED).agg(F.sum("weight").alias("n")).toPandas()
    detail = problems.orderBy(*_ORDER).limit(DETAIL_LIMIT).select(*detail_columns).toPandas()
    return counts, detail


def _as_problem(frame: DataFrame, problem: str | Column, time: str, weight: Column | None = None,
                epoch: str | None = None) -> DataFrame:
    """`frame`'s rows as problems; `epoch`: the column of the epoch a problem is counted under (the epochs table's
    unattested), else none."""
    return frame.select(F.lit(problem).alias("problem") if isinstance(problem, str) else problem.alias("problem"),
                        "queue", "seq", "message_id", "backup", F.col(time).alias("t"),
                        (weight if weight is not None else F.lit(1)).alias("weight"),
                        (F.col(epoch) if epoch else F.lit(None).cast("bigint")).alias("epoch"))


def _aside(aside: DataFrame, completes: DataFrame) -> DataFrame:
    """The messages kept aside at a rejoin, as problems: confirmed as replicated (a complete is logged before its
    confirmation leaves, so a killed primary's log lacks none), diverged; the rest, whose publisher was never
    told they were safe, kept aside alone."""
    confirmed = completes.select("uid", "seq").distinct().withColumn("confirmed", F.lit(True))
    judged = aside.join(confirmed, ["uid", "seq"], "left")
    return _as_problem(judged, F.when(F.col("confirmed"), F.lit(DIVERGED)).otherwise(F.lit(KEPT_ASIDE)), "t")


def _pivot(counts: pd.DataFrame, index: list[str], columns: dict[str, str]) -> pd.DataFrame:
    """The counts (index..., problem, n) of the problems in `columns`: the index's columns, then a column for each
    problem under its name there."""
    chosen = counts[counts["problem"].isin(list(columns))]
    return (chosen.pivot_table(index=index, columns="problem", values="n", aggfunc="sum")
            .rename(columns=columns).reindex(columns=list(columns.values())).reset_index())


def _at_risk(completes: DataFrame, replicas: DataFrame, sizes: DataFrame) -> DataFrame:
    """Confirmations made while fewer than a majority of the cluster held the message: the primary, the
    backups its `complete` names and those that logged a copy before it (_unnamed_holders) are fewer than
    cluster_size // 2 + 1, the size its run's marks give (a run whose marks give none, a log older than the
    field, is not judged). What the floor forbids unless opted out of (ha.min_confirmations: 1): a partition
    can lose such a message. sizes: (broker, run, cluster_size) of the runs whose marks give one."""
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
    # Each backup process's copies it never applied a dequeue of: one aggregation of both kinds of event.
    kept = (replicas.select("uid", "seq", "backup", "run", F.lit(False).alias("removed"))
            .unionByName(mirrored.withColumn("removed", F.lit(True)))
            .groupBy("uid", "seq", "backup", "run").agg(F.max("removed").alias("removed"))
            .filter(~F.col("removed")))
    gone = dequeues.filter(F.col("judged")).select("uid", "seq", "queue", "message_id",
                                                   F.col("broker").alias("primary"), F.col("t").alias("t_deq"))
    return (gone.join(kept, ["uid", "seq"])
            .filter(F.col("backup") != F.col("primary"))  # a promoted backup consuming its own copy
            .join(F.broadcast(runs.select(F.col("broker").alias("backup"), "run", "end")), ["backup", "run"])
            .filter(F.col("end") >= F.col("t_deq") + MIRROR_GRACE_US))


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


def _backup_table(summary: pd.DataFrame, lags: pd.DataFrame, counts: pd.DataFrame) -> pd.DataFrame:
    """lags: the lag's percentiles per queue and backup (_lag_tables)."""
    received = summary[(summary["event"] == schema.REPLICATE) & summary["judged"]]
    result = received.assign(live=received["events"].where(received["mode"] == schema.LIVE, 0),
                             catchup=received["events"].where(received["mode"] == schema.CATCHUP, 0))
    result = (result.rename(columns={"broker": "backup", "events": "received"})
              .groupby(["queue", "backup"], as_index=False)[["received", "live", "catchup"]].sum())
    result = result.merge(lags, on=["queue", "backup"], how="left")
    result = result.merge(counts, on=["queue", "backup"], how="outer")
    numbers = ["received", "live", "catchup", *_COUNT_COLUMNS.values()]
    result[numbers] = result[numbers].fillna(0).astype("int64")
    columns = ["queue", "backup", "received", "live", "catchup", "lag_p50_ms", "lag_p95_ms", "lag_p99_ms",
               "lag_max_ms", "missing", "unverified", "duplicates", "order_violations", "dequeues_not_mirrored"]
    return result[columns].sort_values(["queue", "backup"], ignore_index=True)


def _latency(completions: DataFrame) -> pd.DataFrame:
    """The percentiles per queue of the confirmations' times from their message's first enqueue (completions:
    _measures')."""
    return ranks.percentiles(completions, ["queue"], "completion_us", "completion").drop("count").toPandas()


def _queue_table(summary: pd.DataFrame, latency: pd.DataFrame, backups: pd.DataFrame,
                 queue_counts: pd.DataFrame) -> pd.DataFrame:
    """latency: the percentiles per queue of the judged confirmations' times from their message's first enqueue."""
    logged = _judged_primary_side(summary)
    counts = _event_counts(logged[logged["queue"].notna()], ["queue"])
    result = counts.merge(latency, on="queue", how="left")
    sums = backups.groupby("queue", as_index=False)[list(_COUNT_COLUMNS.values())].sum()
    result = result.merge(sums, on="queue", how="outer").merge(queue_counts, on="queue", how="outer")
    result["backups"] = result["queue"].map(backups.groupby("queue")["backup"].nunique())
    numbers = ["enqueued", "completed", "dequeued", "backups", *_COUNT_COLUMNS.values(), *_QUEUE_COUNT_COLUMNS.values()]
    result[numbers] = result[numbers].fillna(0).astype("int64")
    return result[["queue", "enqueued", "completed", "dequeued", "completion_p50_ms", "completion_p95_ms",
                   "completion_p99_ms", "completion_max_ms", *numbers[3:]]].sort_values("queue", ignore_index=True)


SHARD_COLUMNS: list[str] = ["shard", "queues", "enqueued", "completed", "dequeued", "backups", "received",
                            "lag_p50_ms", "lag_p95_ms", "lag_p99_ms", "lag_max_ms", *_COUNT_COLUMNS.values()]


def _shard_table(summary: pd.DataFrame, lags: pd.DataFrame | None, backups: pd.DataFrame) -> pd.DataFrame:
    """Per shard of a sharded cluster (design/sharding.md): what its primaries logged, its backups' lag (lags:
    _shard_lags'), and the backups table's counts added up. Empty without shards."""
    sharded = _sharded(summary)
    if lags is None:
        return pd.DataFrame(columns=SHARD_COLUMNS).astype({column: "int64" for column in SHARD_COLUMNS}).astype(
            {column: "float64" for column in SHARD_COLUMNS if column.startswith("lag_")})
    logged = _judged_primary_side(sharded)
    logged = logged[logged["queue"].notna()]
    logged = _event_counts(logged, ["shard"]).merge(
        logged.groupby("shard", as_index=False)["queue"].nunique().rename(columns={"queue": "queues"}), on="shard")
    served = backups.merge(_owners(sharded), on="backup").groupby("shard")
    counts = (served[["received", *_COUNT_COLUMNS.values()]].sum()
              .join(served["backup"].nunique().rename("backups")).reset_index())
    result = logged.merge(lags, on="shard", how="outer").merge(counts, on="shard", how="outer")
    numbers = ["queues", "enqueued", "completed", "dequeued", "backups", "received", *_COUNT_COLUMNS.values()]
    result = result.reindex(columns=SHARD_COLUMNS)
    result[["shard", *numbers]] = result[["shard", *numbers]].fillna(0).astype("int64")
    return result.sort_values("shard", ignore_index=True)


def _shard_lags(summary: pd.DataFrame, lag: DataFrame) -> pd.DataFrame | None:
    """The lag's percentiles per shard, of the copies its backups received; None without shards."""
    sharded = _sharded(summary)
    if sharded.empty:
        return None
    owned = _small(lag.sparkSession, _owners(sharded), "backup STRING, shard BIGINT")
    owned_lags = lag.join(F.broadcast(owned), "backup")
    return ranks.percentiles(owned_lags, ["shard"], "lag_us", "lag").drop("count").toPandas()


def _sharded(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["shard"].notna()].astype({"shard": "int64"})


def _owners(sharded: pd.DataFrame) -> pd.DataFrame:
    """(backup, shard): a backup process serves one shard, which its lines name; a queue's copies in other shards
    (step 4's forwarding queues) count where they are."""
    return sharded[["broker", "shard"]].drop_duplicates().rename(columns={"broker": "backup"})


def _inherited_counts(inherited: DataFrame) -> pd.DataFrame:
    """(epoch, broker, inherited_dequeued) of the dequeues of messages first enqueued in an earlier epoch
    (inherited: _measures')."""
    return inherited.groupBy("epoch", "broker").agg(F.count("*").alias("inherited_dequeued")).toPandas()


def _epochs(summary: pd.DataFrame, inherited: pd.DataFrame, unattested: pd.DataFrame) -> pd.DataFrame:
    """Each epoch's primary, how many messages it took over from earlier epochs and consumed, and how
    many its backups hold that its log does not record (an epoch whose primary left no event at all
    shows with no primary). inherited: (epoch, broker, inherited_dequeued): how many judged dequeues each
    primary did of messages first enqueued in an earlier epoch."""
    logged = _judged_primary_side(summary)
    spans = logged.groupby(["epoch", "broker"], as_index=False).agg(first_event=("first", "min"),
                                                                     last_event=("last", "max"))
    table = spans.merge(_event_counts(logged, ["epoch", "broker"]), on=["epoch", "broker"])
    for column in ("first_event", "last_event"):
        table[column] = pd.to_datetime(table[column], unit="us")
    result = (table.merge(inherited, on=["epoch", "broker"], how="left").fillna({"inherited_dequeued": 0})
              .rename(columns={"broker": "primary"}))
    result = result.merge(unattested, on="epoch", how="outer")
    numbers = ["enqueued", "completed", "dequeued", "inherited_dequeued", "unattested"]
    result[numbers] = result[numbers].fillna(0).astype("int64")
    return result.sort_values(["epoch", "first_event"], ignore_index=True)


# ---- client ledgers ----------------------------------------------------------------------------

LEDGER_COLUMNS: list[str] = ["queue", "confirmed", "received", "lost", "duplicated", "unexpected", "left_on_queue",
                             "kept_local"]
LEDGER_PROBLEM_COLUMNS: list[str] = ["problem", "queue", "id", "time"]
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
        counts: pd.DataFrame = union.groupBy("queue", "kind").count().toPandas()
        if counts.empty:
            return pd.DataFrame(columns=LEDGER_COLUMNS), pd.DataFrame(columns=LEDGER_PROBLEM_COLUMNS)
        detail: pd.DataFrame = (union.filter(F.col("kind").isin(LOST, DUPLICATED, UNEXPECTED))
                                .orderBy("kind", "queue", "t").limit(DETAIL_LIMIT)
                                .select(F.col("kind").alias("problem"), "queue", "id",
                                        F.timestamp_micros("t").alias("time"))
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


def _bucket(totals: dict[str, Any]) -> int:
    """The timeline's bucket (µs), sized to the span of the events: also totals["bucket_ms"]."""
    span_us = (totals["last"] - totals["first"]) // pd.Timedelta(microseconds=1) if totals["events"] else 0
    bucket_us = next((b for b in _BUCKETS_US if span_us / b <= TIMELINE_POINTS), _BUCKETS_US[-1])
    totals["bucket_ms"] = bucket_us / 1000
    return bucket_us


def _lag_stats(lag: DataFrame, bucket_us: int) -> pd.DataFrame:
    """The lag's percentiles per queue and backup, and per backup and time bucket: one pass over the lags, with a
    grouping set each (_lag_tables parts them)."""
    bucket = F.timestamp_micros((F.col("t") / bucket_us).cast("long") * bucket_us)
    return (ranks.percentiles(lag.withColumn("time", bucket), ["queue", "backup", "time"], "lag_us", "lag",
                              sets=[["queue", "backup"], ["backup", "time"]])
            .withColumnRenamed("count", "messages").toPandas())


def _lag_tables(stats: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The lag's percentiles per queue and backup, and per backup over time (the timeline), of _lag_stats."""
    by_queue = stats["set"] == 1  # time not grouped: (queue, backup)
    lags = stats.loc[by_queue, ["queue", "backup", "lag_p50_ms", "lag_p95_ms", "lag_p99_ms", "lag_max_ms"]]
    timeline = stats.loc[~by_queue, ["backup", "time", "messages", "lag_p50_ms", "lag_p99_ms", "lag_max_ms"]]
    # A few hundred rows a backup: sorted here, not by Spark.
    return lags.reset_index(drop=True), timeline.sort_values(["backup", "time"], ignore_index=True)


def _totals(summary: pd.DataFrame) -> dict[str, Any]:
    events = int(summary["events"].sum())
    first, last = (TimestampType().fromInternal(int(summary[column].agg(how))) if events else None
                   for column, how in (("first", "min"), ("last", "max")))
    return {"events": events, "judged": int(summary.loc[summary["judged"], "events"].sum()),
            "brokers": summary["broker"].nunique(), "first": first, "last": last}
