"""The audit event schema: one JSON object per line (design/audit-events.md).

Shared by the writer (events.py), the Spark job (lag.py) and the test event sets, so the three
cannot drift apart. Pure Python: the broker imports it without PySpark.
"""
from __future__ import annotations

# Event kinds. The primary (or a standalone broker) writes ENQUEUE, COMPLETE and DEQUEUE; a backup
# writes REPLICATE, DEQUEUE (a dequeue the primary told it about) and DIVERGED (a message it kept aside
# at a rejoin: the new primary never had it). Every broker writes a MARK at least once a second and
# when it stops: its log is complete up to its last line, busy or idle.
ENQUEUE, COMPLETE, DEQUEUE, REPLICATE, MARK, DIVERGED = (
    "enqueue", "complete", "dequeue", "replicate", "mark", "diverged")
EVENTS = (ENQUEUE, COMPLETE, DEQUEUE, REPLICATE, MARK, DIVERGED)

PRIMARY, BACKUP, STANDALONE = "primary", "backup", "standalone"

# How a replicated message reached a backup: as a live enqueue, or in catch-up (it was on the queue
# before the backup subscribed).
LIVE, CATCHUP = "live", "catchup"

# Field -> Spark SQL type. Times are microseconds since the Unix epoch, each broker's own clock.
FIELDS: dict[str, str] = {
    "t": "BIGINT",  # when the event happened on the writing broker
    "event": "STRING",
    "broker": "STRING",
    "role": "STRING",  # the writer's role when the event happened
    "epoch": "BIGINT",  # the highest HA epoch the writer had seen
    "shard": "BIGINT",  # the writer's shard in a sharded cluster (design/sharding.md); absent otherwise
    "run": "BIGINT",  # the writer's start time: one broker process (a restart starts a new run)
    "n": "BIGINT",  # line number within the run: the order events happened in
    "queue": "STRING",  # this and the next: every event but mark
    "uid": "STRING",  # the queue's unique id: a queue re-created under the same name has another
    "seq": "BIGINT",  # the message's number on its queue, the same on the primary and every backup
    "message_id": "STRING",  # properties.message-id as text; null when the message has none
    "backups": "ARRAY<STRING>",  # complete: the backups ready for this queue when it was confirmed
    # complete: false for a message kept off the backups (x-replicate: false, or transient under
    # x-replicate: durable), whose loss in a failover is no loss of a replicated message; absent otherwise
    "replicated": "BOOLEAN",
    "mode": "STRING",  # replicate: live or catchup
    "enqueued": "BIGINT",  # replicate: the primary's time carried with a live message (0 in catch-up)
    # mark: the brokers of the writer's HA cluster (ha.brokers; 1 without HA), what a `complete`'s backups are
    # judged against (a majority must hold a message). Once a second, not per message; absent in older logs.
    "cluster_size": "BIGINT",
}

REQUIRED = ("t", "event", "broker", "role", "epoch", "run", "n")
_MESSAGE = ("queue", "uid", "seq")
REQUIRED_FOR: dict[str, tuple[str, ...]] = {ENQUEUE: _MESSAGE, DEQUEUE: _MESSAGE, COMPLETE: (*_MESSAGE, "backups"),
                                            REPLICATE: (*_MESSAGE, "mode", "enqueued"), MARK: (),
                                            DIVERGED: _MESSAGE}

DDL = ", ".join(f"`{name}` {kind}" for name, kind in FIELDS.items())  # for Spark's from_json
# A line that is not a JSON object of these types, as text (the fields null): Spark's corrupt-record column when it
# reads JSON lines, and a column of a Parquet event file (columnar.py) for the lines kept as they were.
CORRUPT = "_corrupt_record"

# Client ledgers (`haqueue audit lag --ledger`, ledger.py): one JSON object per line, written by a
# producer for each message the broker confirmed and by a consumer for each message it received.
CONFIRMED, RECEIVED = "confirmed", "received"
LEDGER_OPS = (CONFIRMED, RECEIVED)
LEDGER_FIELDS: dict[str, str] = {
    "client": "STRING",  # who wrote the line (a producer or consumer's name)
    "queue": "STRING",  # the queue (the address) sent to or received from
    "id": "STRING",  # properties.message-id, as the events give it (message_id)
    "op": "STRING",  # confirmed | received
    "t": "BIGINT",  # when, µs since the Unix epoch, on the client's clock
}
LEDGER_DDL = ", ".join(f"`{name}` {kind}" for name, kind in LEDGER_FIELDS.items())
