"""Spark sessions and the audit's inputs, read as a whole (`audit lag`) or as a stream (`audit watch`):
the brokers' event lines (schema.py) and client ledgers, each line checked the same way."""
from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from haqueue.audit import class_archive, parts, schema
from haqueue.audit.exits import UsageError
from haqueue.audit.storage import local_path


# Bytes of event files per shuffle partition (tune_for). Under it the whole audit takes one, and runs without
# adaptive execution, whose extra job per query stage cost more than it saved on small sets: an audit of
# a few hundred events took 26 s in a fresh JVM with 8 partitions and it, 17.5 s without (issue 27's trims).
BYTES_PER_PARTITION = 64 << 20
# The JVMs' garbage collector when this process starts them: the throughput collector, for a batch job. G1's
# concurrent threads took about 12 CPU-s of a 10M-event audit on 2 cores; without them (and lag._small's Python
# workers) it took 0.85-0.89 of the time (bench/RESULTS.md). A --conf of the same keys replaces it.
JVM_OPTIONS = "-XX:+UseParallelGC"
# ... and for an input under BYTES_PER_PARTITION (jvm_options): the audit of a small input is nearly all a fixed
# part (starting the JVM, planning each query, compiling Spark's code and the generated code), and C2 compiling the
# code that plans and runs its few rows costs more than it saves; C1 alone and the serial collector took about
# half the JVM's CPU of such an audit (bench/RESULTS.md). On a large input C2's code runs the events ~1.5x as fast.
SMALL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Jobs share the cores between pools, not in the order they came (FIFO): an audit runs queries side by side, and
# lag.py puts the problems' chain of small jobs in a pool of its own, not queued behind the lag's large tasks
# (bench/RESULTS.md). A --conf of the key replaces it.
SCHEDULER_MODE = "FAIR"


def session(master: str | None = None, conf: Mapping[str, str] | None = None, debug: bool = False,
            size: int | None = None) -> SparkSession:
    """A Spark session: `master`, else spark-submit's, else local[*]. `conf` (the command's --conf) wins
    over the defaults here: the driver's memory for an input of `size` (driver_memory), the JVMs' options
    (jvm_options; the driver's also class_archive's) and the scheduler's mode (SCHEDULER_MODE), on any master; no
    web UI on a local one. Under spark-submit its JVM is already running: its own --conf settings stand.
    Spark logs only fatal errors unless `debug`: a failed job is told in one line (failures.py).
    UsageError if this process runs a session on another master than `master`: Spark would hand that one
    back, and the audit would run there, not where it was asked to; it is the caller's, left running."""
    conf = dict(conf or {})
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this process and its JVM
    running = SparkContext._active_spark_context
    if running is not None and master is not None and running.master != master:
        raise UsageError(f"this process already runs a Spark session on {running.master}: it cannot audit on "
                         f"{master} (stop that session first, or audit on {running.master})")
    # Applied as the context starts: under spark-submit, whose JVM logs at INFO (the `haqueue` command's, a
    # shell's, at WARN), the context's start would otherwise print some 50 lines before the audit's own.
    defaults = {"spark.log.level": _LOG_LEVEL[debug]}
    if not submitted:
        master = master or "local[*]"
        options = jvm_options(size)
        # The driver's JVM starts with this session unless this process started one before: with its classes' archive
        started = SparkContext._gateway is not None
        driver = options if started else f"{options} {class_archive.java_options()}".rstrip()
        defaults |= {"spark.driver.memory": driver_memory(master, size), "spark.ui.showConsoleProgress": "false",
                     "spark.driver.extraJavaOptions": driver, "spark.executor.extraJavaOptions": options,
                     "spark.scheduler.mode": SCHEDULER_MODE}
    if master is not None and master.startswith("local"):
        defaults["spark.ui.enabled"] = "false"
    builder = SparkSession.builder.appName("haqueue-audit").config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    for key, value in {**defaults, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _drop_broken_calls(getattr(SparkContext._gateway, "_gateway_client", None))
    spark.sparkContext.setLogLevel(_LOG_LEVEL[debug])  # a running session's too
    return spark


_LOG_LEVEL = {False: "FATAL", True: "ERROR"}  # Spark's, without and with --debug


def _drop_broken_calls(client: Any) -> None:
    """Make the Py4J client of the driver's JVM close a call's connection when an interrupt breaks the call off
    before its answer came, as Py4J itself does for KeyboardInterrupt (Ctrl-C) but not for others: a caller's
    timeout (pytest-timeout's Failed), a signal handler's SystemExit. Left open, the answer still to come would be
    read by the next call on the connection as its own, and each call after by the one before it: the command's
    cleanup (unpersisting, stopping the session) failed with "SparkSession does not exist in the JVM" in place of
    the interrupt, and every later session of the process with KeyError 'c'. The next call opens a connection of
    its own. Py4J's ClientServer (PySpark's, with pinned threads) keeps a connection per thread; its older gateway
    client, a pool it takes one from per call, never gives back a broken one: nothing to do there."""
    if not hasattr(client, "get_thread_connection") or getattr(client, "_haqueue_guarded", False):
        return
    send = client.send_command

    def send_command(*args: Any, **kwargs: Any) -> Any:
        try:
            return send(*args, **kwargs)
        except BaseException as error:
            connection = client.get_thread_connection()
            if not isinstance(error, (Exception, KeyboardInterrupt)) and connection is not None:
                connection.close(reset=True)
            raise

    client.send_command = send_command
    client._haqueue_guarded = True


def jvm_options(size: int | None) -> str:
    """The JVMs' options for an input of `size` bytes (EventInput.size; None: not known before the session)."""
    return SMALL_JVM_OPTIONS if size is not None and size < BYTES_PER_PARTITION else JVM_OPTIONS


def tune_for(spark: SparkSession, size: int, given: Collection[str] = ()) -> None:
    """Size the session's shuffles from its input's `size` in bytes: a partition per BYTES_PER_PARTITION, up
    to four per core, on any master. What the user set stays: the settings named in `given` (the command's
    --conf: in a session that was already running they are not in its SparkContext's conf) and those of
    the SparkContext's conf (spark-submit's --conf, spark-defaults.conf)."""
    context = spark.sparkContext
    conf = context.getConf()

    def free(key: str) -> bool:
        return key not in given and not conf.contains(key)

    if free("spark.sql.shuffle.partitions"):
        partitions = min(max(1, size // BYTES_PER_PARTITION), 4 * context.defaultParallelism)
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    if size < BYTES_PER_PARTITION and free("spark.sql.adaptive.enabled"):
        spark.conf.set("spark.sql.adaptive.enabled", "false")


# The driver's memory (driver_memory): what it needs beside the audit's caches (the files' listing, the result
# tables it collects, the queries' own work), and heap per byte of input for the caches. A cache of every line
# (uncompressed) took 55 bytes an event of bench/audit_scale.py's set: 0.31 byte per byte of JSON lines, 0.57 per
# byte of Parquet as weighed (PARQUET_WEIGHT). The audit keeps JSON lines so (lag.analyse_input), and the facts of
# every message (facts.prove), less; Spark keeps cached blocks in at most 60 % of the heap.
# At most half the machine's memory: the rest is the OS's page cache and the spill's.
DRIVER_BASE = 2 << 30
CACHE_PER_BYTE = 1.0
UNKNOWN_SIZE_MEMORY = "4g"  # an input listed only by Spark (hdfs://...) or none


def driver_memory(master: str, size: int | None) -> str:
    """spark.driver.memory for an input of `size` bytes of JSON lines (EventInput.size): on a local master the
    driver is the executor too and holds the audit's caches (what does not fit is spilled to
    disk, and read back slower); on a cluster the executors hold it, and the driver DRIVER_BASE."""
    if size is None:
        return UNKNOWN_SIZE_MEMORY
    wanted = DRIVER_BASE + (int(CACHE_PER_BYTE * size) if master.startswith("local") else 0)
    most = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    return f"{max(DRIVER_BASE, min(wanted, most)) >> 20}m"


def input_size(location: str) -> int | None:
    """What read_events sizes the event files under `location` at (EventInput.size), listed before the session
    starts: its JVM's memory is fixed then (driver_memory). None unless `location` is on the driver's file
    system (a path or file://): without a JVM the driver cannot list hdfs:// or s3a://."""
    path = local_path(location)
    if path is None or not os.path.isdir(path):
        return None
    json_bytes = parquet_bytes = 0
    for root, directories, names in os.walk(path):
        directories[:] = [name for name in directories if not name.startswith(_SKIPPED)]
        files = {name for name in names if not name.startswith(_SKIPPED)}
        for name in files:
            if name.endswith(parts.PARQUET):
                parquet_bytes += os.path.getsize(os.path.join(root, name))
            elif name.endswith(parts.SUFFIX) and name[:-len(parts.SUFFIX)] + parts.PARQUET not in files:
                json_bytes += os.path.getsize(os.path.join(root, name))
    return _weighed(json_bytes, parquet_bytes)


# ---- reading -----------------------------------------------------------------------------------

# What a byte of a Parquet event file stands for in JSON lines, for tune_for: 10 million events take 1.8 GB as
# JSON lines and 94 MB as zstd Parquet (bench/audit_scale.py's set); real ids compress less.
PARQUET_WEIGHT = 10
_SKIPPED = (".", "_")  # names Spark's file index leaves out (hidden, or its own such as _checkpoint)
_EVENTS_CORRUPT_DDL = f"{schema.DDL}, `{schema.CORRUPT}` STRING"


@dataclass(frozen=True)
class EventInput:
    """The event files under a directory, as Spark reads them, and their lines."""

    lines: DataFrame  # every line, checked (_checked): the events and the lines that are not
    files: int
    bytes: int  # on disk
    size: int  # in bytes of JSON lines (a Parquet byte counts PARQUET_WEIGHT): what tune_for sizes the shuffles from
    json_files: int  # of `files`, those read as JSON lines: each query that reads them parses them again


def read_events(spark: SparkSession, directory: str) -> EventInput:
    """The event files under `directory` at any depth, `*.jsonl` and `*.parquet` (columnar.py), less names
    starting with `.` or `_` (Spark skips them). A file converted to Parquet is read once: where
    `NAME.parquet` and `NAME.jsonl` are side by side, the JSON lines are left out. Lazy: Spark lists the
    files now and reads them when a query needs them; a bad line is counted (unusable), never fatal. A file of a
    newer format than this build reads, as its name says, is refused before any is read (NewerFormat)."""
    jsonl = _event_files(_json_reader(spark.read, schema.DDL), parts.SUFFIX).json(directory)
    parquet = _event_files(spark.read.schema(_EVENTS_CORRUPT_DDL), parts.PARQUET).parquet(directory)
    json_files, parquet_files = jsonl.inputFiles(), parquet.inputFiles()
    for name in (*json_files, *parquet_files):
        parts.check_format(name)
    converted = {name[:-len(parts.PARQUET)] + parts.SUFFIX for name in parquet_files}
    if converted.intersection(json_files):
        json_files = [name for name in json_files if name not in converted]
        jsonl = _json_reader(spark.read, schema.DDL).json(json_files)
    frames, size = [], 0
    if json_files:
        frames.append(_checked(_with_file(jsonl), _event_problem(), schema.FIELDS))
        size = _size(jsonl)
    if parquet_files or not frames:  # an empty directory: no lines
        frames.append(_checked(_parquet_lines(parquet), _event_problem(), schema.FIELDS))
    parquet_bytes = _size(parquet) if parquet_files else 0
    lines = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
    return EventInput(lines, len(json_files) + len(parquet_files), size + parquet_bytes,
                      _weighed(size, parquet_bytes), len(json_files))


def _weighed(json_bytes: int, parquet_bytes: int) -> int:
    return json_bytes + PARQUET_WEIGHT * parquet_bytes


def usable(lines: DataFrame, fields: Collection[str] = schema.FIELDS) -> DataFrame:
    """The checked lines (_checked) that can be used, typed."""
    return lines.filter(F.col("problem").isNull()).select(*fields)


def unusable(lines: DataFrame) -> DataFrame:
    """The checked lines (_checked) that cannot: file, problem, line."""
    return lines.filter(F.col("problem").isNotNull()).select("file", "problem", "line")


def _event_files(reader: Any, suffix: str) -> Any:
    return reader.option("recursiveFileLookup", "true").option("pathGlobFilter", f"*{suffix}")


def _parquet_lines(parquet: DataFrame) -> DataFrame:
    """A Parquet event file's rows, and the lines columnar.py kept as text (not a JSON object of the events'
    types) parsed as read_events parses JSON lines: an event, or a line with a problem."""
    typed = _with_file(parquet).filter(F.col(schema.CORRUPT).isNull())
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": schema.CORRUPT}
    kept = (_with_file(parquet).filter(F.col(schema.CORRUPT).isNotNull())
            .select(F.from_json(schema.CORRUPT, _EVENTS_CORRUPT_DDL, options).alias("parsed"), "file")
            .select("parsed.*", "file"))
    return typed.unionByName(kept)


def _with_file(lines: DataFrame) -> DataFrame:
    return lines.withColumn("file", F.col("_metadata.file_name"))


def _size(files: DataFrame) -> int:
    """The bytes of a file source's files, from Spark's own file index (its plan's statistics)."""
    return int(files._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())  # a Scala BigInt


def stream_events(spark: SparkSession, directory: str, **options: str) -> DataFrame:
    """The valid events of the files that appear in `directory` (Spark's file source: each file is
    read once, when it appears, so it must appear whole: staging.py puts them there); bad lines are
    left out. `options` go to the file source (e.g. cleanSource)."""
    reader = _json_reader(spark.readStream, schema.DDL).option("pathGlobFilter", f"*{parts.SUFFIX}")
    for name, value in options.items():
        reader = reader.option(name, value)
    return usable(_checked(_with_file(reader.json(directory)), _event_problem(), schema.FIELDS))


def _event_problem() -> Column:
    """Why an event line cannot be used (null: it can)."""
    problem = F.when(F.col(schema.CORRUPT).isNotNull(), F.lit("unparsable"))
    problem = problem.when(_any_null(F.col(name) for name in schema.REQUIRED), F.lit("missing field"))
    problem = problem.when(~F.col("event").isin(*schema.EVENTS), F.lit("unknown event"))
    for kind, names in schema.REQUIRED_FOR.items():
        problem = problem.when((F.col("event") == kind) & _any_null(F.col(name) for name in names),
                               F.lit("missing field"))
    return problem


def read_ledgers(spark: SparkSession, paths: Sequence[str]) -> tuple[DataFrame, DataFrame]:
    """(valid ledger lines, typed; bad lines with their problem). A bad line is counted, never fatal."""
    lines = _json_reader(spark.read, schema.LEDGER_DDL).json(list(paths))
    problem = F.when(F.col(schema.CORRUPT).isNotNull(), F.lit("unparsable"))
    problem = problem.when(_any_null(F.col(name) for name in schema.LEDGER_FIELDS), F.lit("missing field"))
    problem = problem.when(~F.col("op").isin(*schema.LEDGER_OPS), F.lit("unknown op"))
    checked = _checked(_with_file(lines), problem, schema.LEDGER_FIELDS)
    return usable(checked, schema.LEDGER_FIELDS), unusable(checked)


def _json_reader(reader: Any, ddl: str) -> Any:
    """A batch or stream reader of JSON lines with `ddl`'s fields and the line itself when it is not JSON."""
    return (reader.schema(f"{ddl}, `{schema.CORRUPT}` STRING").option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", schema.CORRUPT))


def _checked(lines: DataFrame, problem: Column, fields: Collection[str]) -> DataFrame:
    """`fields` and `problem` (null: the line can be used) of each line, and for a line with a problem its `file`
    and the `line` (as read, or its fields as JSON when it parsed): a bad line's own columns are null elsewhere."""
    checked = lines.withColumn("problem", problem)
    bad = F.col("problem").isNotNull()
    return checked.select(*fields, "problem", F.when(bad, F.col("file")).alias("file"),
                          F.when(bad, F.coalesce(F.col(schema.CORRUPT), F.to_json(F.struct(*fields)))).alias("line"))


def _any_null(columns: Any) -> Column:
    result = F.lit(False)
    for column in columns:
        result = result | column.isNull()
    return result
