"""What goes between a source cluster's primary and a standby cluster (design/mirroring.md): the addresses, the
link properties, the transfer kinds, and the annotation every mirrored message carries on the standby.

The mirror protocol is versioned on its own, apart from HA's replication protocol: the two sites may run
different releases, and only these links cross between them. A standby refuses a source whose protocols it
does not share, naming both.
"""
from __future__ import annotations

import os
from typing import Final

from ..ha import test_hooks

PROTOCOL: Final = 2
OLDEST_PROTOCOL: Final = 1
BATCH_PROTOCOL: Final = 2  # the first whose queue links carry BATCH transfers
# A test hook, never a config key (as HA's HAQUEUE_TEST_PROTOCOLS): "OLDEST-NEWEST" makes this broker speak only
# those, as a build of another release would; the tests of mirroring between releases set it. Warned of at start.
TEST_PROTOCOLS: Final = "HAQUEUE_TEST_MIRROR_PROTOCOLS"


def spoken() -> tuple[int, int]:
    """The mirror protocols this broker speaks: [OLDEST_PROTOCOL, PROTOCOL], unless TEST_PROTOCOLS says."""
    return test_hooks.protocols(os.environ.get(TEST_PROTOCOLS, "")) or (OLDEST_PROTOCOL, PROTOCOL)

STATE: Final = "$mirror.state"  # the standby sends one message: what it holds of each of this source's queues
QUEUE: Final = "$mirror.queue"  # one queue's mirror link: "$mirror.queue/<name>", the source sends
WIRING: Final = "$mirror.wiring"  # (protocol 2) the source sends its wiring into its mirrored queues (wiring.py)

# Link properties the source gives both links.
CLUSTER: Final = "x-mirror-cluster"  # the source cluster's name (mirror.cluster)
EPOCH: Final = "x-mirror-epoch"  # the source's mirror epoch: a standby refuses one lower than it has seen
FIRST_EPOCH: Final = 1  # a source's until a promotion raises it (a later step: design/mirroring.md)
PROTOCOLS: Final = "x-mirror-protocols"  # [oldest, newest] the source speaks
REVERSES: Final = "x-mirror-reverses"  # (after `mirror reverse`) the cluster it was promoted over: its queues become
# this source's mirrors, what they held that was never mirrored kept aside
# ... and a queue link:
UID: Final = "x-mirror-uid"  # the source queue's unique id: one deleted and re-created is another queue
ARGS: Final = "x-mirror-args"  # its arguments, declared with it on the standby
APPLIED: Final = "x-mirror-applied"  # (a reverse's) the newest seq of the old source's it held when promoted

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
# (protocol 2) the messages of one pass in one transfer, HA's layout (ha.protocol.batch_index: the messages as the
# source holds them, then each one's seq and size); tag: the first seq. Settled once the standby's guards have them
# all. The standby adds SEQ_ANNOTATION to each as it applies it: the source rewrites nothing.
BATCH: Final = b"B"
DEQUEUE: Final = b"D"  # body: source seq ranges dequeued at the source; pre-settled
# (protocol 2) the queue was deleted at the source: the standby deletes its mirror. Pre-settled, the link's last; a
# source that was away when it was deleted sends it, on a link of its own, for a queue the standby's state names
# that matches its globs and that it no longer has.
DELETED: Final = b"X"

# The standby's state message names the protocol both use (the newest both speak); a standby of protocol 1 names
# none, and 1 is used.
STATE_PROTOCOL: Final = "protocol"


def chosen(protocols: list[int]) -> int:
    """The protocol a standby uses with a source announcing `protocols` (one it does not refuse)."""
    return min(protocols[1], spoken()[1])


def refusal(protocols: object) -> str | None:
    """Why a source announcing `protocols` ([oldest, newest]) cannot mirror here, or None."""
    if not (isinstance(protocols, list) and len(protocols) == 2 and all(isinstance(p, int) for p in protocols)):
        return "the source announced no mirror protocol (x-mirror-protocols)"
    oldest, newest = protocols
    own_oldest, own_newest = spoken()
    if newest < own_oldest or oldest > own_newest:
        return (f"the source speaks mirror protocol {oldest}-{newest}, this standby {own_oldest}-{own_newest}: "
                f"upgrade the {'source' if newest < own_oldest else 'standby'}")
    return None
