"""`haqueue audit watch`: replication lag and missing copies, live: a Spark Structured Streaming job
over the brokers' event files as they are written (design/audit-watch.md).

Per window of event time, per queue and backup: how many live copies the backup received and their
lag percentiles; and, as soon as it is certain, every confirmed message that a backup ready at
its confirmation did not log within the bound (missing: the streaming counterpart of `audit lag`'s
`missing`). Both come from measures.py, the definitions `audit lag` uses. The files are handed to
Spark's file source by staging.py; output goes to the console or, with --parquet, to Parquet files.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from haqueue.audit import measures, schema
from haqueue.audit.exits import EXIT_OK, UsageError
from haqueue.audit.sources import session, stream_events
from haqueue.audit.staging import Stager
from haqueue.audit.storage import local_path, uri

# How late (in event time) an event may reach the stream and still count: brokers' lines of one
# staging round reach it together, one round apart at worst. Clock differences between machines add
# to this; a watch over brokers whose clocks differ by more drops their events as late.
LATENESS = timedelta(seconds=2)
STAGE_EVERY = 1  # seconds between staging rounds, and between micro-batches
LAG, MISSING = "lag", "missing"  # the two kinds of output row


@dataclass
class Watch:
    """What `haqueue audit watch` was asked to do."""

    events: str
    window: timedelta = timedelta(seconds=10)
    bound: timedelta = measures.DEFAULT_BOUND
    parquet: str | None = None
    checkpoint: str | None = None  # default: PARQUET/_checkpoint, or a temporary one for the console
    master: str | None = None
    once: bool = False  # judge what is written now, as a finished record, and stop
    seconds: float | None = None  # stop after this long (None: when interrupted)
    conf: dict[str, str] = field(default_factory=dict)  # Spark settings given (--conf)
    debug: bool = False


def results(spark: SparkSession, staged: str, window: timedelta, bound: timedelta) -> DataFrame:
    """The streaming query over the event files appearing in `staged`: one row per window, queue and
    backup with the lag (kind LAG), and one per missing copy (kind MISSING), each when it is final."""
    events = measures.timed(stream_events(spark, uri(staged), cleanSource="delete")).withWatermark(
        "time", f"{LATENESS.total_seconds()} seconds")
    primary_side = events.filter(F.col("role") != schema.BACKUP)
    replicas = events.filter(F.col("event") == schema.REPLICATE).withColumnRenamed("broker", "backup")
    lag = measures.live_lag(replicas, primary_side.filter(F.col("event") == schema.ENQUEUE))
    windows = (lag.groupBy(F.window("time", f"{window.total_seconds()} seconds"), "queue", "backup")
               .agg(F.count("*").alias("live"), *measures.percentiles("lag_us", "lag")))
    absent = measures.absent_copies(primary_side.filter(F.col("event") == schema.COMPLETE), replicas,
                                    primary_side.filter(F.col("event") == schema.DEQUEUE), bound)
    missing = measures.missing(absent, events.filter(F.col("event") == schema.MARK), bound)
    width = int(window.total_seconds() * 1_000_000)
    start = F.timestamp_micros(F.floor(F.unix_micros("time") / width) * width)  # of the confirmation's window
    return (windows.select(F.lit(LAG).alias("kind"), F.col("window.start").alias("window_start"),
                           F.col("window.end").alias("window_end"), "queue", "backup", "live", *_LAG_COLUMNS,
                           *_empty("seq", "message_id", "confirmed"))
            .unionByName(missing.select(F.lit(MISSING).alias("kind"), start.alias("window_start"),
                                        (start + F.expr(f"INTERVAL {window.total_seconds()} SECONDS"))
                                        .alias("window_end"), "queue", "backup", *_empty("live", *_LAG_COLUMNS),
                                        "seq", "message_id", F.col("time").alias("confirmed"))))


_LAG_COLUMNS = [f"lag_p{int(p * 100)}_ms" for p in measures.PERCENTILES] + ["lag_max_ms"]
# The output's columns that one kind of row leaves empty, and their types.
_TYPES = {"live": "bigint", **{c: "double" for c in _LAG_COLUMNS}, "seq": "bigint", "message_id": "string",
          "confirmed": "timestamp"}


def _empty(*names: str) -> list[Column]:
    return [F.lit(None).cast(_TYPES[name]).alias(name) for name in names]


# ---- the console ---------------------------------------------------------------------------------

def lines(rows: list[Row], bound: timedelta) -> list[str]:
    """What the console shows for a micro-batch's rows: the windows that closed, then the missing."""
    out = []
    for r in sorted((r for r in rows if r["kind"] == LAG), key=lambda r: (r["window_start"], r["queue"], r["backup"])):
        lags = ", ".join(f"{c[4:-3]} {r[c]:.3f}" for c in _LAG_COLUMNS)
        out.append(f"{_clock(r['window_start'])}–{_clock(r['window_end'])} {r['queue']} {r['backup']}: "
                   f"{r['live']:,} live, lag ms {lags}")
    for r in sorted((r for r in rows if r["kind"] == MISSING), key=lambda r: (r["confirmed"], r["queue"], r["seq"])):
        message = "with no message-id" if r["message_id"] is None else r["message_id"]
        out.append(f"MISSING {r['queue']} on {r['backup']}: message {message} (seq {r['seq']}), confirmed "
                   f"{_clock(r['confirmed'])} naming {r['backup']}, not on {r['backup']} within "
                   f"{bound.total_seconds():g} s")
    return out


def _clock(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _printer(bound: timedelta) -> Callable[[DataFrame, int], None]:
    """foreachBatch's callback: print the micro-batch's lines."""
    def show(batch: DataFrame, _: int) -> None:
        for line in lines(batch.collect(), bound):
            print(line, flush=True)
    return show


# ---- running it ----------------------------------------------------------------------------------

def run_watch(watch: Watch) -> int:
    """`haqueue audit watch`: stage, stream and print (or write) until stopped; the exit code. UsageError
    for paths it cannot use."""
    events, checkpoint = _local_paths(watch)
    temporary = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="haqueue-watch-")
    stager = Stager(events, checkpoint)
    if stager.ended:
        raise UsageError(f"{checkpoint} was ended by --once: give another checkpoint")
    spark = session(watch.master, watch.conf, watch.debug)
    try:
        query = _start(spark, watch, stager, checkpoint)
        print(f"haqueue audit watch: {watch.events}, windows of {watch.window.total_seconds():g} s, missing after "
              f"{watch.bound.total_seconds():g} s, to {watch.parquet or 'the console'}", flush=True)
        _follow(query, stager, watch)
    finally:
        spark.stop()
        if temporary:
            shutil.rmtree(checkpoint, ignore_errors=True)
    return EXIT_OK


def _local_paths(watch: Watch) -> tuple[str, str | None]:
    """(events, checkpoint: None for a temporary one) as the driver's paths. The stager reads the events
    as the brokers append to them, from byte offsets, and renames its staged files into the checkpoint:
    in Python, on the driver's file system, not through Hadoop (an object store has neither appends
    nor renames). The executors read the staged files: the checkpoint must be shared with them."""
    events = local_path(watch.events)
    if events is None:
        raise UsageError(f"--events of audit watch must be on the driver's file system (a path or file://), "
                         f"where the brokers append to their files: {watch.events}")
    if not os.path.isdir(events):
        raise UsageError(f"no such directory: {watch.events}")
    if watch.checkpoint is not None:
        checkpoint = local_path(watch.checkpoint)
    elif watch.parquet is not None:
        parquet = local_path(watch.parquet)
        checkpoint = None if parquet is None else os.path.join(parquet, "_checkpoint")
    else:
        return events, None
    if checkpoint is None:
        raise UsageError("the checkpoint holds the staged event files and must be on the driver's file system "
                         "(a path or file://, shared with the executors): give --checkpoint")
    return events, checkpoint


def _start(spark: SparkSession, watch: Watch, stager: Stager, checkpoint: str) -> StreamingQuery:
    # Every branch of the query watermarks the same event times, each over its own kind of event:
    # the query's event time is the newest any of them has seen (the default, the oldest, would
    # stall on a kind that stops coming, such as enqueues while no one publishes).
    spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "max")
    # State stays in memory (the default store): a few seconds of events. RocksDB's commits made each
    # micro-batch 2-3 times slower here, and so every window and alarm later.
    # A state store per operator and shuffle partition, each a commit per micro-batch: one partition on a
    # local master, one per core on a cluster (Spark's 200 there kept a --once watch of a few hundred events
    # running for minutes on two one-core workers). A setting given (--conf, spark-submit's) stands.
    context = spark.sparkContext
    if "spark.sql.shuffle.partitions" not in watch.conf and not context.getConf().contains("spark.sql.shuffle.partitions"):
        local = (context.master or "").startswith("local")
        spark.conf.set("spark.sql.shuffle.partitions", "1" if local else str(context.defaultParallelism))
    stager.stage()
    if watch.once:  # past every window and bound: all is final
        stager.finish(int((watch.window + measures.COPY_HORIZON + 2 * watch.bound + LATENESS
                           + timedelta(days=1)).total_seconds() * 1_000_000))
    writer = results(spark, stager.staged, watch.window, watch.bound).writeStream.outputMode("append")
    writer = writer.option("checkpointLocation", uri(os.path.join(checkpoint, "spark")))
    writer = (writer.trigger(availableNow=True) if watch.once
              else writer.trigger(processingTime=f"{STAGE_EVERY} seconds"))
    if watch.parquet:
        return writer.format("parquet").option("path", uri(watch.parquet)).start()
    return writer.foreachBatch(_printer(watch.bound)).start()


def _follow(query: StreamingQuery, stager: Stager, watch: Watch) -> None:
    """Stage new lines every STAGE_EVERY seconds while the query runs (until it ends, the time is up,
    or Ctrl-C)."""
    deadline = None if watch.seconds is None else time.monotonic() + watch.seconds
    try:
        while not query.awaitTermination(STAGE_EVERY):
            if deadline is not None and time.monotonic() >= deadline:
                break
            if not watch.once:
                stager.stage()
    except KeyboardInterrupt:
        pass
    finally:
        query.stop()
    failure = query.exception()
    if failure is not None:  # command.py tells it in one line
        raise failure
