"""What one aggregation of each message's events can prove: that the message shows no problem at all.

The batch audit (lag.py) judges a message by joining its events with each other: its confirmation with the
backups' copies, its dequeue with the backups' dequeues, and so on, a join per problem over every event. On a
healthy cluster nearly every message passes them all, and those joins were most of the audit's time (issue 29).
Here one aggregation by message (uid, seq) counts and bounds each kind of event per broker (`_facts`), and a
message whose counts and bounds rule out every problem is sound (`_sound`). lag.py runs its exact checks on the
events of the other messages alone, the suspects: a handful of 10 million on a healthy cluster, every message on
a broken one. The checks stay the only definition of each problem; this module only decides which messages they
need to look at. What the audit measures of a sound message (the lag of each copy, the confirmation's latency,
a dequeue by a later epoch's primary) is read off its facts (`Proof`), as the joins would find it.

So a mistake here could hide a problem only by calling a message sound that is not. Each condition of `_sound`
names the problems it rules out, and each is stricter than the check it stands for: a message whose events are
in any way unusual (an event logged twice, a backup restarted between two of its events, a copy outside the
bounds of the check) is a suspect, and judged by the checks. tests/audit/test_facts.py audits event sets with
every kind of problem planted both ways, every message a suspect and suspects alone, and compares every table.
The problems not judged per message (copies out of order: an order across messages) are not judged here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from haqueue.audit import measures, schema

# Brokers get columns of their own in the aggregation: lag.py judges every message by the checks beyond this many.
MAX_BROKERS = 16
# Suspects at most this many are handed to every executor (a broadcast) to pick their events out; more are
# joined with the events as any two large frames (a message per row either way).
BROADCAST_SUSPECTS = 1_000_000
# Suspects at most this many are also named by seq in the query that picks their events out: the Parquet reader
# then skips the row groups whose seqs hold none of them, most of the files on a healthy cluster.
NAMED_SUSPECTS = 256


@dataclass(frozen=True)
class Proof:
    """The facts of every message (`_facts`, one row per uid, seq and queue, and whether they prove it sound), the
    suspects among them, and what the audit's figures take from the sound ones: what lag.py would get from joining
    their events, read off their facts instead. Both frames are persisted: `unpersist` when done."""

    facts: DataFrame  # what Proof's figures are read from (_MEASURED), and `sound`
    suspects: DataFrame  # (uid, seq)
    brokers: Sequence[str]
    few: bool  # at most BROADCAST_SUSPECTS suspects
    seqs: Sequence[int] | None  # the suspects' seqs, if at most NAMED_SUSPECTS suspects

    def events(self, ev: DataFrame) -> DataFrame:
        """The suspects' events in `ev`."""
        if self.seqs is not None:  # as equalities: an `IN` of more than a few values reaches Parquet as a range
            ev = ev.filter(reduce(Column.__or__, (F.col("seq") == seq for seq in self.seqs), F.lit(False)))
        return ev.join(self._picked(), ["uid", "seq"], "left_semi")

    def sound(self) -> DataFrame:
        """The facts of the sound messages."""
        return self.facts.filter(F.col("sound")).join(self._picked(), ["uid", "seq"], "left_anti")

    def lags(self) -> DataFrame:
        """measures.live_lag's rows of the sound messages: one per live copy in the window judged, its lag from
        the one enqueue logged (if within LAG_HORIZON before the copy to CLOCK_SKEW after it), else from the
        enqueue time the copy carried."""
        micros = timedelta(microseconds=1)
        copies = F.inline(F.array(*(F.struct(F.lit(name).alias("backup"), F.col(f"copy_t_{i}").alias("t"),
                                             F.col(f"live_{i}").alias("live"), F.col(f"carried_{i}").alias("carried"))
                                    for i, name in enumerate(self.brokers))))
        within = ((F.col("enqueue_t") >= F.col("t") - measures.LAG_HORIZON // micros)
                  & (F.col("enqueue_t") <= F.col("t") + measures.CLOCK_SKEW // micros))
        enqueued = F.when(within, F.col("enqueue_t")).when(F.col("carried") > 0, F.col("carried"))
        return (self.sound().select("queue", "enqueue_t", copies).filter(F.col("live") == 1)
                .select("queue", "backup", F.timestamp_micros("t").alias("time"), "t",
                        (F.col("t") - enqueued).alias("lag_us")))

    def completions(self) -> DataFrame:
        """(queue, completion_us) of the sound messages' confirmations in the window judged: from the first enqueue."""
        return (self.sound().filter(F.col("confirmed_judged") == 1)
                .select("queue", (F.col("confirmed_t") - F.col("enqueue_t")).alias("completion_us")))

    def inherited(self) -> DataFrame:
        """(epoch, broker) of the sound messages' dequeues in the window judged that a primary of a later epoch than
        the message's first enqueue did."""
        broker = F.element_at(_names(self.brokers), F.col("dequeuer").cast("int") + 1)
        return (self.sound().filter((F.col("dequeued_judged") == 1) & (F.col("enqueue_epoch") < F.col("dequeue_epoch")))
                .select(F.col("dequeue_epoch").alias("epoch"), broker.alias("broker")))

    def unpersist(self) -> None:
        self.facts.unpersist()
        self.suspects.unpersist()

    def _picked(self) -> DataFrame:
        return F.broadcast(self.suspects) if self.few else self.suspects


def prove(ev: DataFrame, brokers: Sequence[str], largest_cluster: int | None,
          bound: timedelta = measures.DEFAULT_BOUND) -> Proof:
    """The facts of the messages in `ev` (lag.py's events, with `judged`), and the suspects: the messages their
    facts cannot prove sound (`_sound`). brokers: every broker that logged an event, at most MAX_BROKERS;
    largest_cluster: the largest cluster size any broker's marks give (None: no marks give one); bound: as
    measures.absent_copies'."""
    messages = ev.filter(F.col("uid").isNotNull() & F.col("seq").isNotNull())
    # Shuffled as events, then aggregated once: a message's events are in different brokers' files, so an
    # aggregation before the shuffle would combine few of them, and shuffle a row of every fact instead (this takes
    # 0.78-0.90 of its time in a warm JVM, bench/RESULTS.md).
    facts = (_coded(messages, brokers).repartition("uid", "seq").groupBy("uid", "seq", "queue")
             .agg(*_facts(brokers))
             .select(*_MEASURED, *_measured_copies(len(brokers)),
                     F.coalesce(_sound(len(brokers), largest_cluster, bound), F.lit(False)).alias("sound"))
             .persist())
    # A message whose events name two queues (a log that contradicts itself) is a suspect as a whole.
    suspects = (facts.groupBy("uid", "seq").agg(F.min(F.col("sound").cast("int")).alias("sound"),
                                                F.count("*").alias("queues"))
                .filter((F.col("sound") == 0) | (F.col("queues") > 1)).select("uid", "seq").persist())
    try:
        named = suspects.limit(NAMED_SUSPECTS + 1).collect()
        if len(named) <= NAMED_SUSPECTS:
            return Proof(facts, suspects, brokers, True, sorted({row.seq for row in named}))
        return Proof(facts, suspects, brokers, suspects.count() <= BROADCAST_SUSPECTS, None)
    except BaseException:  # no Proof for the caller to unpersist
        facts.unpersist()
        suspects.unpersist()
        raise


# The facts kept once `sound` is worked out: what Proof reads off a sound message (its lags, its confirmation's
# latency, a dequeue by a later epoch's primary); the rest would only make the persisted facts wider.
_MEASURED = ["uid", "seq", "queue", "enqueue_t", "enqueue_epoch", "confirmed_t", "confirmed_judged", "dequeued_judged",
             "dequeue_epoch", "dequeuer"]


def _measured_copies(brokers: int) -> list[str]:
    return [f"{name}_{i}" for i in range(brokers) for name in ("copy_t", "live", "carried")]


def _names(brokers: Sequence[str]) -> Column:
    """The brokers' names as an array: position i + 1 is broker index i (_coded's `b`)."""
    return F.array(*map(F.lit, brokers))


def _count(condition: Column) -> Column:
    return F.count(F.when(condition, 1))


def _least(condition: Column, column: str) -> Column:
    return F.min(F.when(condition, F.col(column)))


def _most(condition: Column, column: str) -> Column:
    return F.max(F.when(condition, F.col(column)))


# Each event's kind as _coded gives it: what a message's facts count, told apart by one number.
ENQUEUED, CONFIRMED, KEPT_LOCAL, DEQUEUED, COPY, MIRRORED, ASIDE = range(1, 8)


def _coded(messages: DataFrame, brokers: Sequence[str]) -> DataFrame:
    """The events as numbers the aggregation compares cheaply: `kind` (ENQUEUED... on a primary's side, COPY and
    MIRRORED on a backup's, ASIDE anywhere), `b` the broker's index in `brokers`, `mask` the backups a
    confirmation names (bit i: brokers[i]), and what the facts keep of each."""
    event, primary_side = F.col("event"), F.col("role") != schema.BACKUP
    replicated = F.coalesce(F.col("replicated"), F.lit(True))
    kind = (F.when(primary_side & (event == schema.ENQUEUE), ENQUEUED)
            .when(primary_side & (event == schema.COMPLETE), F.when(replicated, CONFIRMED).otherwise(KEPT_LOCAL))
            .when(event == schema.DEQUEUE, F.when(primary_side, DEQUEUED).otherwise(MIRRORED))
            .when(event == schema.REPLICATE, COPY).when(event == schema.DIVERGED, ASIDE).otherwise(0))
    named = reduce(Column.bitwiseOR, (F.when(F.array_contains("backups", name), 1 << i).otherwise(0)
                                        for i, name in enumerate(brokers)), F.lit(0))
    return messages.select("uid", "seq", "queue", "t", "epoch", "run", "enqueued", "judged", kind.alias("kind"),
                           (F.array_position(_names(brokers), F.col("broker")) - 1).alias("b"),
                           F.when(event == schema.COMPLETE, named).alias("mask"),
                           F.when(event == schema.COMPLETE, F.size("backups")).alias("named"),
                           (F.col("mode") == schema.LIVE).alias("live"))


def _facts(brokers: Sequence[str]) -> list[Column]:
    """Per message (of _coded events): how many enqueues and confirmations its primaries logged (`attested`), its
    enqueues (the first one's time and epoch), its confirmations of a replicated message (`confirmed`: the first
    one's time, how many backups it names and which known ones, how many in the window judged), its dequeues on
    a primary (the first one's epoch and broker, how many judged) and how many brokers kept it aside; per broker
    i (brokers[i]): its copies (`copies_i`, the first one's time, how many live and judged, the latest enqueue
    time they carried), the dequeues it applied as a backup (`mirrored_i`) and the first and last run of those
    two kinds (`run_lo_i`, `run_hi_i`). Numbers only: the aggregation keeps them in a hash map of fixed-width
    rows (strings or arrays would make it sort every event by message first)."""
    kind, b, judged = F.col("kind"), F.col("b"), F.col("judged")
    confirmed, dequeued = kind == CONFIRMED, kind == DEQUEUED
    facts = [_count(kind.isin(ENQUEUED, CONFIRMED, KEPT_LOCAL)).alias("attested"),
             _count(kind == ENQUEUED).alias("enqueues"), _least(kind == ENQUEUED, "t").alias("enqueue_t"),
             _least(kind == ENQUEUED, "epoch").alias("enqueue_epoch"),
             _count(confirmed).alias("confirmed"), _least(confirmed, "t").alias("confirmed_t"),
             _count(confirmed & judged).alias("confirmed_judged"), _most(confirmed, "named").alias("named"),
             _most(confirmed, "mask").alias("mask"),
             _count(dequeued).alias("dequeued"), _count(dequeued & judged).alias("dequeued_judged"),
             _least(dequeued, "epoch").alias("dequeue_epoch"), _least(dequeued, "b").alias("dequeuer"),
             _count(kind == ASIDE).alias("aside")]
    for i in range(len(brokers)):
        copy, held = (kind == COPY) & (b == i), kind.isin(COPY, MIRRORED) & (b == i)
        facts += [_count(copy).alias(f"copies_{i}"), _least(copy, "t").alias(f"copy_t_{i}"),
                  _count(copy & judged & F.col("live")).alias(f"live_{i}"),
                  _most(copy, "enqueued").alias(f"carried_{i}"),
                  _count((kind == MIRRORED) & (b == i)).alias(f"mirrored_{i}"),
                  _least(held, "run").alias(f"run_lo_{i}"), _most(held, "run").alias(f"run_hi_{i}")]
    return facts


def _sound(brokers: int, largest_cluster: int | None, bound: timedelta) -> Column:
    """True for a message whose facts (`_facts`) rule out every problem lag.py judges per message."""
    c = F.col
    micros = timedelta(microseconds=1)
    one_confirmation = c("confirmed") == 1
    # Unattested: a primary logged its enqueue or confirmation. Kept aside: no broker set it aside. One enqueue:
    # the lag of each copy and the confirmation's latency are measured from it (Proof).
    sound = (c("attested") >= 1) & (c("aside") == 0) & (c("enqueues") == 1)
    # At risk: the confirmation names enough backups for a majority of the largest cluster any mark gives, so
    # of its own primary's (a run no mark gives a size is not judged).
    if largest_cluster is not None:
        sound = sound & ((c("confirmed") == 0) | (c("named") + 1 >= F.lit(largest_cluster // 2 + 1)))
    # Missing, unverified: one confirmation, each backup it names known here (no name unaccounted for)...
    sound = sound & ((c("confirmed") == 0) | (one_confirmation & (c("named") == F.bit_count("mask"))))
    for i in range(brokers):
        copies, named = c(f"copies_{i}"), c("mask").bitwiseAND(1 << i) != 0
        # Duplicates: each broker received the message at most once.
        sound = sound & (copies <= 1)
        # ...and each holding its one copy from COPY_HORIZON before the confirmation to `bound` after it.
        sound = sound & ((c("confirmed") == 0) | ~named | ((copies == 1) & c(f"copy_t_{i}").between(
            c("confirmed_t") - F.lit(measures.COPY_HORIZON // micros), c("confirmed_t") + F.lit(bound // micros))))
        # Dequeues not mirrored: at most one dequeue on a primary, and each broker holding a copy either did it
        # or applied one in the run it received the copy in (all its copies and dequeues in one run).
        sound = sound & ((c("dequeued") == 0) | (copies == 0) | (c("dequeuer") == i) | (
            (c(f"mirrored_{i}") >= 1) & (c(f"run_lo_{i}") == c(f"run_hi_{i}"))))
    return sound & (c("dequeued") <= 1)
