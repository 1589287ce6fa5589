"""What goes between a source cluster's primary and a standby cluster (design/mirroring.md): the addresses, the
link properties, the transfer kinds, and the annotation every mirrored message carries on the standby.

The mirror protocol is versioned on its own, apart from HA's replication protocol: the two sites may run
different releases, and only these links cross between them. A standby refuses a source whose protocols it
does not share, naming both.
"""
from __future__ import annotations

from typing import Final

PROTOCOL: Final = 1
OLDEST_PROTOCOL: Final = 1

STATE: Final = "$mirror.state"  # the standby sends one message: what it holds of each of this source's queues
QUEUE: Final = "$mirror.queue"  # one queue's mirror link: "$mirror.queue/<name>", the source sends

# Link properties the source gives both links.
CLUSTER: Final = "x-mirror-cluster"  # the source cluster's name (mirror.cluster)
EPOCH: Final = "x-mirror-epoch"  # the source's mirror epoch: a standby refuses one lower than it has seen
FIRST_EPOCH: Final = 1  # a source's until a promotion raises it (a later step: design/mirroring.md)
PROTOCOLS: Final = "x-mirror-protocols"  # [oldest, newest] the source speaks
# ... and a queue link:
UID: Final = "x-mirror-uid"  # the source queue's unique id: one deleted and re-created is another queue
ARGS: Final = "x-mirror-args"  # its arguments, declared with it on the standby

# The queue argument that marks a queue on the standby as a mirror of the source cluster it names: it is
# replicated and journalled with the standby's wiring, and keeps the queue read-only for clients there.
SOURCE_ARG: Final = "x-mirror-source"  # (and UID: the source queue's uid, which it mirrors)

# The message annotation each mirrored message carries on the standby: its seq on the source. It lives in the
# message's bytes, so the standby's own replication and journal keep it, and a standby that restarts or fails
# over learns again what it holds of each source queue from the messages themselves.
SEQ_ANNOTATION: Final = "x-opt-mirror-seq"

# Transfer kinds on a queue link, in the delivery tag (kind, source seq, source enqueue time in µs: HA's tag,
# ha.protocol.message_tag; ranges as HA's, ha.protocol.encode_ranges).
ENQUEUE: Final = b"E"  # a message; unsettled: the standby settles it once its own guards (backups, disk) have it
DEQUEUE: Final = b"D"  # body: source seq ranges dequeued at the source; pre-settled


def refusal(protocols: object) -> str | None:
    """Why a source announcing `protocols` ([oldest, newest]) cannot mirror here, or None."""
    if not (isinstance(protocols, list) and len(protocols) == 2 and all(isinstance(p, int) for p in protocols)):
        return "the source announced no mirror protocol (x-mirror-protocols)"
    oldest, newest = protocols
    if newest < OLDEST_PROTOCOL or oldest > PROTOCOL:
        return (f"the source speaks mirror protocol {oldest}-{newest}, this standby {OLDEST_PROTOCOL}-{PROTOCOL}: "
                f"upgrade the {'source' if newest < OLDEST_PROTOCOL else 'standby'}")
    return None
