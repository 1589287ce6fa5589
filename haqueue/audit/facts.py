"""What one aggregation of each message's events can prove: that the message shows no problem at all.

The batch audit (lag.py) judges a message by joining its events with each other: its confirmation with the
backups' copies, its dequeue with the backups' dequeues, and so on, a join per problem over every event. On a
healthy cluster nearly every message passes them all, and those joins were most of the audit's time (issue 29).
Here one aggregation by message (uid, seq) counts and bounds each kind of event per broker (`_facts`), and a
message whose counts and bounds rule out every problem is sound (`_sound`). lag.py runs its exact checks on the
events of the other messages alone, the suspects: a handful of 10 million on a healthy cluster, every message on
a broken one. The checks stay the only definition of each problem; this module only decides which messages they
need to look at.

So a mistake here could hide a problem only by calling a message sound that is not. Each condition of `_sound`
names the problems it rules out, and each is stricter than the check it stands for: a message whose events are
in any way unusual (an event logged twice, a backup restarted between two of its events, a copy outside the
bounds of the check) is a suspect, and judged by the checks. tests/audit/test_facts.py audits event sets with
every kind of problem planted both ways, every message a suspect and suspects alone, and compares every table.
The problems not judged per message (copies out of order: an order across messages) are not judged here.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from haqueue.audit import measures, schema

# Brokers get columns of their own in the aggregation: beyond this many, every message is a suspect (its
# checks are exact all the same, only slower).
MAX_BROKERS = 16
# Suspects at most this many are handed to every executor (a broadcast) to pick their events out; more are
# joined with the events as any two large frames (a message per row either way).
BROADCAST_SUSPECTS = 1_000_000


def suspects(ev: DataFrame, brokers: Sequence[str], largest_cluster: int | None,
             bound: timedelta = measures.DEFAULT_BOUND) -> DataFrame:
    """(uid, seq) of every message the facts of its events cannot prove sound (`_sound`). ev: the events
    (lag.py's, with `judged`); brokers: every broker that logged an event; largest_cluster: the largest
    cluster size any broker's marks give (None: no marks give one); bound: as measures.absent_copies'."""
    messages = ev.filter(F.col("uid").isNotNull() & F.col("seq").isNotNull())
    if len(brokers) > MAX_BROKERS:
        return messages.select("uid", "seq").distinct()
    facts = messages.groupBy("uid", "seq").agg(*_facts(brokers))
    return facts.filter(~F.coalesce(_sound(len(brokers), largest_cluster, bound), F.lit(False))).select("uid", "seq")


def events_of(ev: DataFrame, chosen: DataFrame) -> DataFrame:
    """The events of the messages (uid, seq) in `chosen` (persisted: it is counted first)."""
    if chosen.count() <= BROADCAST_SUSPECTS:
        chosen = F.broadcast(chosen)
    return ev.join(chosen, ["uid", "seq"], "left_semi")


def _count(condition: Column) -> Column:
    return F.count(F.when(condition, 1))


def _least(condition: Column, column: str) -> Column:
    return F.min(F.when(condition, F.col(column)))


def _most(condition: Column, column: str) -> Column:
    return F.max(F.when(condition, F.col(column)))


def _facts(brokers: Sequence[str]) -> list[Column]:
    """Per message: how many enqueues and confirmations its primaries logged (`attested`), how many
    confirmations of a replicated message (`confirmed`), their time and how many backups the confirmation
    names, how many dequeues the primaries logged and kept asides any broker did; per broker i (brokers[i]):
    its copies (`copies_i`, their first and last time), the dequeues it applied as a backup (`mirrored_i`),
    the first and last run of those two kinds (`run_lo_i`, `run_hi_i`), the dequeues it did as a primary
    (`dequeued_i`) and the confirmations naming it (`named_i`). Numbers only: the aggregation keeps them in a
    hash map of fixed-width rows (strings or arrays would make it sort every event by message first)."""
    event, role, broker = F.col("event"), F.col("role"), F.col("broker")
    primary_side = role != schema.BACKUP
    confirmed = primary_side & (event == schema.COMPLETE) & F.coalesce(F.col("replicated"), F.lit(True))
    dequeued = primary_side & (event == schema.DEQUEUE)
    copy = event == schema.REPLICATE
    mirrored = (event == schema.DEQUEUE) & (role == schema.BACKUP)
    facts = [_count(primary_side & event.isin(schema.ENQUEUE, schema.COMPLETE)).alias("attested"),
             _count(confirmed).alias("confirmed"), _least(confirmed, "t").alias("confirmed_t"),
             F.max(F.when(confirmed, F.size("backups"))).alias("named"),
             _count(dequeued).alias("dequeued"), _count(event == schema.DIVERGED).alias("aside")]
    for i, name in enumerate(brokers):
        on = broker == name
        facts += [_count(copy & on).alias(f"copies_{i}"), _least(copy & on, "t").alias(f"copy_lo_{i}"),
                  _most(copy & on, "t").alias(f"copy_hi_{i}"), _count(mirrored & on).alias(f"mirrored_{i}"),
                  _least((copy | mirrored) & on, "run").alias(f"run_lo_{i}"),
                  _most((copy | mirrored) & on, "run").alias(f"run_hi_{i}"),
                  _count(dequeued & on).alias(f"dequeued_{i}"),
                  _count(confirmed & F.array_contains("backups", name)).alias(f"named_{i}")]
    return facts


def _sound(brokers: int, largest_cluster: int | None, bound: timedelta) -> Column:
    """True for a message whose facts (`_facts`) rule out every problem lag.py judges per message."""
    c = F.col
    micros = timedelta(microseconds=1)
    one_confirmation = c("confirmed") == 1
    # Unattested: a primary logged its enqueue or confirmation. Kept aside: no broker set it aside.
    sound = (c("attested") >= 1) & (c("aside") == 0)
    # At risk: the confirmation names enough backups for a majority of the largest cluster any mark gives, so
    # of its own primary's (a run no mark gives a size is not judged).
    if largest_cluster is not None:
        sound = sound & ((c("confirmed") == 0) | (c("named") + 1 >= F.lit(largest_cluster // 2 + 1)))
    # Missing, unverified: one confirmation, each backup it names known here (no name unaccounted for)...
    sound = sound & ((c("confirmed") == 0) | (one_confirmation & (
        c("named") == reduce(lambda a, b: a + b, [c(f"named_{i}") for i in range(brokers)], F.lit(0)))))
    for i in range(brokers):
        copies, named = c(f"copies_{i}"), c(f"named_{i}")
        # Duplicates: each broker received the message at most once.
        sound = sound & (copies <= 1)
        # ...and each holding its one copy from COPY_HORIZON before the confirmation to `bound` after it.
        sound = sound & ((named == 0) | ((copies == 1) & (
            c(f"copy_lo_{i}") >= c("confirmed_t") - F.lit(measures.COPY_HORIZON // micros))
            & (c(f"copy_hi_{i}") <= c("confirmed_t") + F.lit(bound // micros))))
        # Dequeues not mirrored: at most one dequeue on a primary, and each broker holding a copy either did it
        # or applied one in the run it received the copy in (all its copies and dequeues in one run).
        sound = sound & ((c("dequeued") == 0) | (copies == 0) | (c(f"dequeued_{i}") == 1) | (
            (c(f"mirrored_{i}") >= 1) & (c(f"run_lo_{i}") == c(f"run_hi_{i}"))))
    return sound & (c("dequeued") <= 1)
