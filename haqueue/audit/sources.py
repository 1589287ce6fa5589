"""Spark sessions and the audit's inputs, read as a whole (`audit lag`) or as a stream (`audit watch`):
the brokers' event lines (schema.py) and client ledgers, each line checked the same way."""
from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from haqueue.audit import schema


# Bytes of event files per shuffle partition (tune_for). Under it the whole audit takes one, and runs without
# adaptive execution, whose extra job per query stage cost more than it saved on small sets: an audit of
# a few hundred events took 26 s in a fresh JVM with 8 partitions and it, 17.5 s without (issue 27's trims).
BYTES_PER_PARTITION = 64 << 20


def session(master: str | None = None, conf: Mapping[str, str] | None = None, debug: bool = False) -> SparkSession:
    """A Spark session: `master`, else spark-submit's, else local[*]. `conf` (the command's --conf) wins
    over the defaults here: 4 GB for the driver, which collects the result tables, on any master; no web UI
    on a local one. Under spark-submit its JVM is already running: its own --conf settings stand.
    Spark logs only fatal errors unless `debug`: a failed job is told in one line (failures.py)."""
    conf = dict(conf or {})
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this process and its JVM
    if master is None and not submitted:
        master = "local[*]"
    defaults = {} if submitted else {"spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"}
    if master is not None and master.startswith("local"):
        defaults["spark.ui.enabled"] = "false"
    builder = SparkSession.builder.appName("haqueue-audit").config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    for key, value in {**defaults, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR" if debug else "FATAL")
    return spark


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


# ---- reading -----------------------------------------------------------------------------------

_CORRUPT = "_corrupt_record"  # Spark puts a line here, and nulls in the fields, when it is not JSON


def read_events(spark: SparkSession, directory: str) -> tuple[DataFrame, DataFrame]:
    """(valid events, typed; bad lines with their problem). A bad line is counted, never fatal."""
    lines = (_json_reader(spark.read, schema.DDL).option("recursiveFileLookup", "true")
             .option("pathGlobFilter", "*.jsonl").json(directory))
    return _checked(lines, _event_problem(), schema.FIELDS)


def stream_events(spark: SparkSession, directory: str, **options: str) -> DataFrame:
    """The valid events of the files that appear in `directory` (Spark's file source: each file is
    read once, when it appears, so it must appear whole: staging.py puts them there); bad lines are
    left out. `options` go to the file source (e.g. cleanSource)."""
    reader = _json_reader(spark.readStream, schema.DDL).option("pathGlobFilter", "*.jsonl")
    for name, value in options.items():
        reader = reader.option(name, value)
    valid, _ = _checked(reader.json(directory), _event_problem(), schema.FIELDS)
    return valid


def _event_problem() -> Column:
    """Why an event line cannot be used (null: it can)."""
    problem = F.when(F.col(_CORRUPT).isNotNull(), F.lit("unparsable"))
    problem = problem.when(_any_null(F.col(name) for name in schema.REQUIRED), F.lit("missing field"))
    problem = problem.when(~F.col("event").isin(*schema.EVENTS), F.lit("unknown event"))
    for kind, names in schema.REQUIRED_FOR.items():
        problem = problem.when((F.col("event") == kind) & _any_null(F.col(name) for name in names),
                               F.lit("missing field"))
    return problem


def read_ledgers(spark: SparkSession, paths: Sequence[str]) -> tuple[DataFrame, DataFrame]:
    """(valid ledger lines, typed; bad lines with their problem), as read_events."""
    lines = _json_reader(spark.read, schema.LEDGER_DDL).json(list(paths))
    problem = F.when(F.col(_CORRUPT).isNotNull(), F.lit("unparsable"))
    problem = problem.when(_any_null(F.col(name) for name in schema.LEDGER_FIELDS), F.lit("missing field"))
    problem = problem.when(~F.col("op").isin(*schema.LEDGER_OPS), F.lit("unknown op"))
    return _checked(lines, problem, schema.LEDGER_FIELDS)


def _json_reader(reader: Any, ddl: str) -> Any:
    """A batch or stream reader of JSON lines with `ddl`'s fields and the line itself when it is not JSON."""
    return (reader.schema(f"{ddl}, `{_CORRUPT}` STRING").option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", _CORRUPT))


def _checked(lines: DataFrame, problem: Column, fields: Collection[str]) -> tuple[DataFrame, DataFrame]:
    """(the lines without a problem, typed; the others as file, problem, line)."""
    checked = lines.withColumn("file", F.col("_metadata.file_name")).withColumn("problem", problem)
    valid = checked.filter(F.col("problem").isNull()).select(*fields)
    bad = checked.filter(F.col("problem").isNotNull()).select(
        "file", "problem", F.coalesce(F.col(_CORRUPT), F.to_json(F.struct(*fields))).alias("line"))
    return valid, bad


def _any_null(columns: Any) -> Column:
    result = F.lit(False)
    for column in columns:
        result = result | column.isNull()
    return result
