"""What the primary and its backups say to each other: addresses, link properties, and the
encoding of queue-replication transfers. design/replication.md explains the protocol.

Queue replication carries its metadata in the delivery tag, not in message annotations: the
primary forwards each message's bytes untouched (no per-message re-encoding) and the backup
stores exactly the bytes the primary holds.
"""
from __future__ import annotations

import struct
from typing import Any, Final, cast

from ..broker import amqp_values

WIRING: Final = "$ha.wiring"
QUEUE: Final = "$ha.queue"  # a queue's replication link: "$ha.queue/<name>"
REPORT: Final = "$ha.report"  # a backup's reports to its primary: what it holds in memory and on disk
ADOPT: Final = "$ha.adopt"  # a backup gives its primary the messages it holds that the primary never had: "$ha.adopt/<queue>"
REPORT_INTERVAL: Final = 1.0  # seconds between a backup's reports
EPOCH_SEQ_SHIFT: Final = 40  # each epoch numbers queue messages from epoch << 40: no two primaries share a seq

# The replication protocol (design/upgrades.md): a broker speaks every protocol from OLDEST_PROTOCOL to PROTOCOL,
# and two peers use the newest both speak. Release 0.1.0 spoke protocol 1 and announced nothing: a peer whose
# open carries no PROTOCOLS speaks 1 alone.
PROTOCOL: Final = 2
OLDEST_PROTOCOL: Final = 1
FLAGS_PROTOCOL: Final = 2  # the first to carry the cluster's feature flags (a `features` event on the wiring link)
FIRST_PROTOCOL: Final = 2  # the first to take a `first` event: subscribe to this queue before the others
# Connection properties each end of a peer connection sends in its open frame (protocol 2 on).
PROTOCOLS: Final = "x-ha-protocols"  # [oldest, newest] it speaks
FEATURES: Final = "x-ha-features"  # the feature flags its build supports
RELEASE: Final = "x-ha-release"  # its release version, for messages and status
NAME: Final = "x-ha-name"  # its broker name

# Link properties a backup sends when it attaches.
BROKER: Final = "x-ha-broker"  # the backup's name
EPOCH: Final = "x-ha-epoch"  # the highest epoch the backup has seen
UID: Final = "x-ha-uid"  # the id of the queue the backup holds under this name
HAVE: Final = "x-ha-have"  # seq ranges the backup holds, flattened: [first, last, first, last, ...]
# Connection properties a broker gives a peer in its open frame.
HAD_PRIMARY: Final = "x-ha-had-primary"  # has it ever followed or been a primary
ROLE: Final = "x-ha-role"
STATE: Final = "x-ha-state"
FRESHNESS: Final = "x-ha-freshness"  # how complete its store is: [epoch, standing, stream] (design/store.md)
CLIENT_ADDRESS: Final = "x-ha-client-address"  # "HOST:PORT" it serves clients on as primary ("": none it can name)

# Transfer kinds on a queue link (the tag's first byte).
ENQUEUE: Final = b"E"  # a live enqueue: the backup's settlement is its confirmation
BATCH: Final = b"B"  # live enqueues of one pass, many messages to a transfer (pack_batch); settled as one
TXN_PART: Final = b"T"  # a live enqueue that is part of a transaction's commit (tag: seq, transaction number)
COMMIT: Final = b"K"  # a transaction's commit marker on each queue it touches (tag: transaction number; body: a
# map {queues, dequeues}); settled once the backup has every queue's marker and applied it all
CATCHUP: Final = b"C"  # a message that was on the queue before the backup subscribed (sent newest first)
DEQUEUE: Final = b"D"  # body: seq ranges dequeued on the primary
DIVERGED: Final = b"V"  # body: seq ranges the backup holds that the primary never had: it adopts them or keeps them aside
ADOPTED: Final = b"O"  # on `$ha.adopt`: one such message, tagged with its old seq; settled once the primary's copy is safe
ACQUIRE: Final = b"A"  # body: seq ranges delivered to a consumer and not yet settled there
REDELIVERED: Final = b"R"  # body: (seq, delivery-count) pairs packed as ranges: failed deliveries raised them to it
CAUGHT_UP: Final = b"M"  # the backup now has everything; settling it tells the primary

_TAG: Final = struct.Struct(">cQQ")  # kind, seq, primary enqueue time (microseconds since the epoch)
_RANGE: Final = struct.Struct(">QQ")
_COUNT: Final = struct.Struct(">I")


def message_tag(kind: bytes, seq: int, enqueued_us: int) -> bytes:
    return _TAG.pack(kind, seq, enqueued_us)


def read_tag(tag: bytes) -> tuple[bytes, int, int]:
    return _TAG.unpack(tag) if len(tag) == _TAG.size else (tag[:1], 0, 0)


def batch_index(seqs: list[int], sizes: list[int]) -> bytes:
    """What follows a batch's messages: each one's seq, then each one's size, then their count. The
    messages go first, untouched, as separate pieces of the transfer (no copy into one buffer here)."""
    count = len(seqs)
    return struct.pack(f">{count}Q{count}I", *seqs, *sizes) + _COUNT.pack(count)


def unpack_batch(body: bytes) -> list[tuple[int, bytes]]:
    """A batch's (seq, message) pairs, in the order the primary enqueued them."""
    end = len(body) - _COUNT.size
    (count,) = _COUNT.unpack_from(body, end)
    index = struct.unpack_from(f">{count}Q{count}I", body, end - 12 * count)
    pairs = []
    offset = 0
    for seq, size in zip(index[:count], index[count:]):
        pairs.append((seq, body[offset:offset + size]))
        offset += size
    return pairs


def encode_ranges(runs: list[tuple[int, int]]) -> bytes:
    return b"".join(_RANGE.pack(first, last) for first, last in runs)


def decode_ranges(body: bytes) -> list[tuple[int, int]]:
    return [_RANGE.unpack_from(body, i) for i in range(0, len(body), _RANGE.size)]


def show_ranges(runs: list[tuple[int, int]], most: int = 3) -> str:
    """Seq ranges for a log line, each seq as epoch:number, the first `most` of them."""
    def seq(s: int) -> str:
        return f"{s >> EPOCH_SEQ_SHIFT}:{s & ((1 << EPOCH_SEQ_SHIFT) - 1)}"
    shown = ", ".join(seq(first) if first == last else f"{seq(first)}..{seq(last)}" for first, last in runs[:most])
    return shown + (f" and {len(runs) - most} more ranges" if len(runs) > most else "")


def flatten(runs: list[tuple[int, int]]) -> list[int]:
    return [n for run in runs for n in run]


def unflatten(values: list[Any]) -> list[tuple[int, int]]:
    return [(int(values[i]), int(values[i + 1])) for i in range(0, len(values) - 1, 2)]


def encode_map(body: dict[str, Any]) -> bytes:
    """A wiring event (declare, delete, bind, membership...) or a report as an encoded message: a cold path, but a
    snapshot of 10,000 queues is on a failover's critical path (amqp_values: proton's codec from C)."""
    return amqp_values.encode_body(body)


# What one wiring message may hold, in codec values (broker/codec.py): a snapshot of thousands of queues is sent
# in parts within this.
MESSAGE_NODES: Final = 30_000


def decode_map(data: bytes) -> dict[str, Any]:
    return cast(dict[str, Any], amqp_values.decode_body(data))  # peers send maps only (encode_map)
