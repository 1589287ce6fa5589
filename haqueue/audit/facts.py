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


@dataclass(frozen=True)
class Proof:
    """The facts of every message (`_facts`, one row per uid, seq and queue, and whether they prove it sound), the
    suspects among them, and what the audit's figures take from the sound ones: what lag.py would get from joining
    their events, read off their facts instead. Both frames are persisted: `unpersist` when done."""

    facts: DataFrame
    suspects: DataFrame  # (uid, seq)
    brokers: Sequence[str]

    def events(self, ev: DataFrame) -> DataFrame:
        """The suspects' events in `ev`."""
        return ev.join(self._few(self.suspects), ["uid", "seq"], "left_semi")

    def sound(self) -> DataFrame:
        """The facts of the sound messages (a message split over two queue names is a suspect as a whole)."""
        return self.facts.filter(F.col("sound")).join(self._few(self.suspects), ["uid", "seq"], "left_anti")

    def lags(self) -> DataFrame:
        """measures.live_lag's rows of the sound messages: one per live copy in the window judged, its lag from
        the one enqueue logged (if within LAG_HORIZON before the copy to CLOCK_SKEW after it), else from the
        enqueue time the copy carried."""
        micros = timedelta(microseconds=1)
        copies = F.inline(F.array(*(F.struct(F.lit(name).alias("backup"), F.col(f"copy_lo_{i}").alias("t"),
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
        broker = F.coalesce(*(F.when(F.col(f"dequeued_{i}") == 1, F.lit(name)) for i, name in enumerate(self.brokers)))
        return (self.sound().filter((F.col("dequeued_judged") == 1) & (F.col("enqueue_epoch") < F.col("dequeue_epoch")))
                .select(F.col("dequeue_epoch").alias("epoch"), broker.alias("broker")))

    def unpersist(self) -> None:
        self.facts.unpersist()
        self.suspects.unpersist()

    def _few(self, suspects: DataFrame) -> DataFrame:
        return F.broadcast(suspects) if suspects.count() <= BROADCAST_SUSPECTS else suspects


def prove(ev: DataFrame, brokers: Sequence[str], largest_cluster: int | None,
          bound: timedelta = measures.DEFAULT_BOUND) -> Proof:
    """The facts of the messages in `ev` (lag.py's events, with `judged`), and the suspects: the messages their
    facts cannot prove sound (`_sound`). brokers: every broker that logged an event, at most MAX_BROKERS;
    largest_cluster: the largest cluster size any broker's marks give (None: no marks give one); bound: as
    measures.absent_copies'."""
    messages = ev.filter(F.col("uid").isNotNull() & F.col("seq").isNotNull())
    facts = (messages.groupBy("uid", "seq", "queue").agg(*_facts(brokers))
             .withColumn("sound", F.coalesce(_sound(len(brokers), largest_cluster, bound), F.lit(False)))
             .persist())
    suspects = facts.filter(~F.col("sound")).select("uid", "seq").distinct().persist()
    return Proof(facts, suspects, brokers)


def _count(condition: Column) -> Column:
    return F.count(F.when(condition, 1))


def _least(condition: Column, column: str) -> Column:
    return F.min(F.when(condition, F.col(column)))


def _most(condition: Column, column: str) -> Column:
    return F.max(F.when(condition, F.col(column)))


def _facts(brokers: Sequence[str]) -> list[Column]:
    """Per message: how many enqueues and confirmations its primaries logged (`attested`), its enqueues (the
    first one's time and epoch), its confirmations of a replicated message (`confirmed`: the first one's time,
    how many backups it names, how many in the window judged), its dequeues on a primary (the first one's
    epoch, how many judged) and how many brokers kept it aside; per broker i (brokers[i]): its copies (`copies_i`,
    their first and last time, how many live and judged, the enqueue time they carried), the dequeues it applied
    as a backup (`mirrored_i`), the first and last run of those two kinds (`run_lo_i`, `run_hi_i`), the dequeues
    it did as a primary (`dequeued_i`) and the confirmations naming it (`named_i`). Numbers only: the aggregation
    keeps them in a hash map of fixed-width rows (strings or arrays would make it sort every event by message
    first)."""
    event, role, broker = F.col("event"), F.col("role"), F.col("broker")
    primary_side = role != schema.BACKUP
    confirmed = primary_side & (event == schema.COMPLETE) & F.coalesce(F.col("replicated"), F.lit(True))
    dequeued = primary_side & (event == schema.DEQUEUE)
    copy = event == schema.REPLICATE
    mirrored = (event == schema.DEQUEUE) & (role == schema.BACKUP)
    judged = F.col("judged")
    enqueued = primary_side & (event == schema.ENQUEUE)
    facts = [_count(primary_side & event.isin(schema.ENQUEUE, schema.COMPLETE)).alias("attested"),
             _count(enqueued).alias("enqueues"), _least(enqueued, "t").alias("enqueue_t"),
             _least(enqueued, "epoch").alias("enqueue_epoch"),
             _count(confirmed).alias("confirmed"), _least(confirmed, "t").alias("confirmed_t"),
             _count(confirmed & judged).alias("confirmed_judged"),
             F.max(F.when(confirmed, F.size("backups"))).alias("named"),
             _count(dequeued).alias("dequeued"), _count(dequeued & judged).alias("dequeued_judged"),
             _least(dequeued, "epoch").alias("dequeue_epoch"), _count(event == schema.DIVERGED).alias("aside")]
    for i, name in enumerate(brokers):
        on = broker == name
        facts += [_count(copy & on).alias(f"copies_{i}"), _least(copy & on, "t").alias(f"copy_lo_{i}"),
                  _most(copy & on, "t").alias(f"copy_hi_{i}"), _count(mirrored & on).alias(f"mirrored_{i}"),
                  _count(copy & on & judged & (F.col("mode") == schema.LIVE)).alias(f"live_{i}"),
                  _most(copy & on, "enqueued").alias(f"carried_{i}"),
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
    # Unattested: a primary logged its enqueue or confirmation. Kept aside: no broker set it aside. One enqueue:
    # the lag of each copy and the confirmation's latency are measured from it (Proof).
    sound = (c("attested") >= 1) & (c("aside") == 0) & (c("enqueues") == 1)
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
