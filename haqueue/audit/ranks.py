"""Exact nearest-rank percentiles of a whole (batch) frame, from a count per distinct value.

The statistic is measures.percentiles': of n values, pX is the one at rank ceil(X/100 * n) in ascending order.
That one is Spark's percentile_disc, which a stream keeps too (`audit watch`); its aggregation holds each group's
counts as an object, which at 10 million events made the batch audit's lag tables the query with the most
garbage collection (bench/RESULTS.md). Here a plain hash aggregation counts each group's values (fixed-width rows),
and a running sum over them in ascending order names the value at each rank: the same value, as the tests check.
"""
from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from haqueue.audit.measures import PERCENTILES


def percentiles(frame: DataFrame, keys: Sequence[str], column: str, prefix: str,
                sets: Sequence[Sequence[str]] | None = None) -> DataFrame:
    """Per distinct `keys`, of `column`'s non-null values: `count`, then {prefix}_p50_ms, _p95_ms, _p99_ms and
    _max_ms (µs in, ms out, rounded as measures.percentiles rounds them). sets: grouping sets of `keys` to group by
    in one pass instead, each row's `set` then being Spark's grouping_id of `keys` (a bit per key left out, the
    first key's the highest)."""
    values = frame.filter(F.col(column).isNotNull())
    if sets is None:
        counted = values.groupBy(*keys, column).agg(F.count("*").alias("n"))
        groups = list(keys)
    else:
        # grouping_id over the keys and `column`, which every set groups by: its bit, the lowest, is always 0.
        counted = (values.groupingSets([[*keys_of_set, column] for keys_of_set in sets], *keys, column)
                   .agg(F.shiftright(F.grouping_id(), 1).alias("set"), F.count("*").alias("n")))
        groups = ["set", *keys]
    ordered = Window.partitionBy(*groups).orderBy(column)
    running = F.sum("n").over(ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    total = F.sum("n").over(ordered.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))
    ranked = counted.select(*groups, column, running.alias("up_to"), total.alias("count"))
    return ranked.groupBy(*groups).agg(F.max("count").alias("count"),
                                       *(_ms(F.min(F.when(F.col("up_to") >= F.ceil(F.col("count") * p), F.col(column))))
                                         .alias(f"{prefix}_p{int(p * 100)}_ms") for p in PERCENTILES),
                                       _ms(F.max(column)).alias(f"{prefix}_max_ms"))


def _ms(micros: Column) -> Column:
    return F.round(micros / 1000.0, 3)
