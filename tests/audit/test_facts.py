"""The audit judges only the messages its facts cannot prove sound (facts.py): the same answers as judging
every message by every check, on event sets with every kind of problem planted; healthy messages never reach
the checks, and every message with a problem does. The failover and partition scenarios' audits (suspects only)
are checked against their known answers, every table a problem shows in, by test_lag."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from eventsets import MS, RUNS, SECOND, T0, EventLog
from haqueue.audit import schema

pytestmark = pytest.mark.slow  # Spark: a session, then seconds per audit

MESSAGES = 400
# What can happen to one message, each as the brokers would log it; "healthy" most often.
FATES = ["healthy"] * 12 + [
    "no copy on b2", "copy twice on b1", "copy late on b2", "copy long before", "b2 dequeue not applied",
    "b2 restarted before its dequeue", "primary log lost it", "names an unknown backup", "names no backup",
    "names no backup, no copies", "confirmed twice", "dequeued twice", "kept aside on b2", "kept off the backups",
    "names b1 twice", "not dequeued", "enqueued twice", "dequeued before confirmed",
    # no problem, but measured otherwise: lag from the time the copy carried (or none), a dequeue inherited
    "copy 5 s after its enqueue", "copy 5 s after, carried nothing", "dequeued by the next primary"]


def mixed_set(seed: int) -> tuple[EventLog, set[int]]:
    """b0 primary of queue q with backups b1 and b2, MESSAGES messages 10 ms apart, each with a fate drawn from
    FATES; b2's log ends three quarters of the way (a crash: the copies it lacks after are unverified, not
    missing). Returns the set and the seqs of the healthy messages logged whole."""
    rng = random.Random(seed)
    log = EventLog()
    b0, b1, b2, b2_again = RUNS[0], RUNS[1], RUNS[2], 5
    end, b2_end = T0 + MESSAGES * 10 * MS + 2 * SECOND, T0 + MESSAGES * 3 // 4 * 10 * MS
    for broker, run, role, last in (("b0", b0, schema.PRIMARY, end), ("b1", b1, schema.BACKUP, end),
                                    ("b2", b2, schema.BACKUP, b2_end)):
        for t in range(T0, last + 1, SECOND // 2):
            log.mark(broker, run, t, role, 1)
    healthy = set()
    for seq in range(1, MESSAGES + 1):
        fate = rng.choice(FATES)
        t = T0 + seq * 10 * MS
        if fate == "healthy" and t + 10 * MS < b2_end:
            healthy.add(seq)

        def primary(event: str, at: int, **fields) -> None:
            log.message("b0", b0, event, at, schema.PRIMARY, 1, seq, **fields)

        def backup(broker: str, run: int, event: str, at: int, **fields) -> None:
            if broker == "b1" or at <= b2_end:
                log.message(broker, run, event, at, schema.BACKUP, 1, seq, **fields)

        if fate != "primary log lost it":
            primary(schema.ENQUEUE, t)
            if fate == "enqueued twice":
                primary(schema.ENQUEUE, t + 100)
        copies = {"b1": t + 300, "b2": t + 400}
        if fate.startswith("copy 5 s after"):
            copies["b1"] = t + 5 * SECOND + MS
        if fate == "copy late on b2":
            copies["b2"] = t + 6 * SECOND
        if fate == "copy long before":
            copies["b1"] = t - 31 * SECOND
        if fate in ("no copy on b2", "names no backup, no copies"):
            copies.pop("b2")
        if fate == "names no backup, no copies":
            copies.pop("b1")
        for broker, at in copies.items():
            run = b1 if broker == "b1" else b2
            for _ in range(2 if fate == "copy twice on b1" and broker == "b1" else 1):
                backup(broker, run, schema.REPLICATE, at, mode=schema.LIVE,
                       enqueued=0 if fate.endswith("carried nothing") else t)
        named = {"names an unknown backup": ["b1", "b2", "b9"], "names no backup": [],
                 "names no backup, no copies": [], "names b1 twice": ["b1", "b1"]}.get(fate, ["b1", "b2"])
        if fate != "primary log lost it":
            replicated = {"replicated": False} if fate == "kept off the backups" else {}
            for _ in range(2 if fate == "confirmed twice" else 1):
                primary(schema.COMPLETE, t + 2 * MS, backups=named, **replicated)
        if fate == "not dequeued":
            continue
        dequeued = t + (MS if fate == "dequeued before confirmed" else 5 * MS)
        if fate == "dequeued by the next primary":
            log.message("b1", b1, schema.DEQUEUE, dequeued, schema.PRIMARY, 2, seq)
        else:
            for _ in range(2 if fate == "dequeued twice" else 1):
                primary(schema.DEQUEUE, dequeued)
            backup("b1", b1, schema.DEQUEUE, dequeued + 200)
        if fate == "b2 restarted before its dequeue":
            backup("b2", b2_again, schema.DEQUEUE, dequeued + 200)
        elif fate != "b2 dequeue not applied" and "b2" in copies:
            backup("b2", b2, schema.DEQUEUE, dequeued + 200)
        if fate == "kept aside on b2":
            backup("b2", b2, schema.DIVERGED, dequeued + 300)
    return log, healthy


def assert_same(proven, judged) -> None:
    """The audit judging suspects alone (`proven`) found what judging every message by every check did."""
    assert proven.totals == judged.totals
    for name, table in judged.tables.items():
        pd.testing.assert_frame_equal(proven.tables[name], table, check_dtype=False, obj=name)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[str, set[int]]:
    """mixed_set(29) written (its directory), and the seqs of its healthy messages logged whole."""
    log, healthy = mixed_set(29)
    return str(log.write(tmp_path_factory.mktemp("mixed") / "events")), healthy


@pytest.fixture(scope="module")
def mixed_judged(local_spark, mixed):
    """The mixed set's audit judging every message by every check: what both of its tests compare with."""
    from haqueue.audit import lag

    return lag.analyse(local_spark(), mixed[0], prove=False)


def test_every_kind_of_problem_is_found_as_when_every_message_is_judged(spark, mixed, mixed_judged):
    from haqueue.audit import lag

    assert_same(lag.analyse(spark, mixed[0]), mixed_judged)
    assert mixed_judged.epochs["inherited_dequeued"].sum() > 0
    assert set(mixed_judged.problems["problem"]) == {lag.MISSING, lag.UNVERIFIED, lag.DUPLICATE, lag.NOT_MIRRORED,
                                                     lag.UNATTESTED, lag.AT_RISK, lag.DIVERGED}


def test_healthy_messages_never_reach_the_checks_and_every_message_with_a_problem_does(spark, mixed, mixed_judged):
    from pyspark.sql import functions as F

    from haqueue.audit import facts, measures
    from haqueue.audit.sources import read_events, usable

    events, healthy = mixed
    ev = measures.timed(usable(read_events(spark, events).lines)).withColumn("judged", F.lit(True))
    proof = facts.prove(ev, ["b0", "b1", "b2"], 3)
    doubtful = {row.seq for row in proof.suspects.collect()}
    proof.unpersist()
    assert len(healthy) > MESSAGES // 4 and not doubtful & healthy
    assert set(mixed_judged.problems["seq"]) <= doubtful
