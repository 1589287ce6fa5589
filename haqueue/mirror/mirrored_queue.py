"""MirroredQueue: a standby's copy of one source queue, and the link that feeds it (design/mirroring.md).

The standby numbers the messages of its queue itself (its own cluster replicates and journals them under its own
seqs); each message also carries its source seq (annotation.SEQ_ANNOTATION). The index maps source seq -> own seq,
so that the source's dequeues find their messages and a message sent twice is applied once. It is rebuilt from the
messages themselves when it is first needed (after this broker's start or promotion), so what the standby holds of
a source queue is whatever its queue holds: durable and replicated exactly as its messages are.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from ..broker.completion import Completion
from ..broker.errors import DECODE
from ..broker.message import expiry, is_message
from ..broker.proton_adapter import ACCEPTED, REJECTED, Link, LinkHandler
from ..broker.queue import Queue, seq_ranges
from ..ha.protocol import decode_ranges, read_tag, unpack_batch
from . import protocol
from .annotation import seq_of, with_seq

log = logging.getLogger("haqueue.mirror")


class MirroredQueue:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.index: dict[int, int] = {}  # source seq -> seq here
        for entry in queue.entries():
            seq = seq_of(entry.data)
            if seq is not None:
                self.index[seq] = entry.seq
        self.last_applied = max(self.index, default=0)
        self.applied = 0  # messages the mirror applied here since this broker made the index (a start, a promotion)
        self.links = 0  # attached sources feeding it (one, but for a moment during a reconnection)

    def holdings(self) -> list[tuple[int, int]]:
        """The source seqs held here, as runs (what the source resumes from); those gone here by other means
        (expired) are forgotten first."""
        live = set(self.queue.live_seqs())
        self.index = {seq: own for seq, own in self.index.items() if own in live}
        return seq_ranges(self.index)

    def apply(self, seq: int, data: bytes, confirmed: Completion) -> None:
        """A message of the source (carrying its seq, annotation.SEQ_ANNOTATION): enqueued here once; `confirmed`
        is held until this cluster's guards have it."""
        if seq not in self.index:
            self.index[seq] = self.queue.enqueue(data, expiry(data), confirmed).seq
            self.last_applied = max(self.last_applied, seq)
            self.applied += 1

    def dequeue(self, runs: list[tuple[int, int]]) -> None:
        own = [self.index.pop(seq) for first, last in runs for seq in range(first, last + 1) if seq in self.index]
        for first, last in seq_ranges(own):
            self.queue.dequeue_range(first, last)

    def status(self) -> dict[str, Any]:
        return {"queue": self.queue.name, "source": self.queue.args.get(protocol.SOURCE_ARG),
                "messages": self.queue.depth, "last_applied_seq": self.last_applied, "applied": self.applied,
                "connected": self.links > 0}


class MirrorReceiver(LinkHandler):
    """A source's `$mirror.queue/<name>` link: its transfers applied to the queue in the order they come."""

    def __init__(self, mirrored: MirroredQueue, link: Link, delete: Callable[[Queue], None]) -> None:
        self.mirrored = mirrored
        self.link = link
        self.delete = delete  # the queue was deleted at the source
        mirrored.links += 1

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        if self.mirrored.queue.deleted:
            return  # by an admin: its source's connection is closing (target.py), nothing on it is settled
        kind, seq, _ = read_tag(Link.tag(delivery))
        if kind == protocol.BATCH:  # protocol 2: settled once every message of it is held here
            confirmed = Completion(lambda: self._applied(delivery))
            for seq, message in unpack_batch(data):
                self.mirrored.apply(seq, with_seq(message, seq), confirmed)
            confirmed.release()
            return
        if kind == protocol.ENQUEUE and is_message(data):  # protocol 1: the source annotated it
            confirmed = Completion(lambda: self._applied(delivery))
            self.mirrored.apply(seq, data, confirmed)
            confirmed.release()
            return
        if kind == protocol.DEQUEUE:
            self.mirrored.dequeue(decode_ranges(data))
            self.link.settle(delivery, 0 if settled else ACCEPTED)
            return
        if kind == protocol.DELETED:
            self.link.settle(delivery, 0 if settled else ACCEPTED)
            self.delete(self.mirrored.queue)
            return
        log.warning("mirror of queue %s: a transfer of unknown kind %r from the source", self.mirrored.queue.name, kind)
        self.link.settle(delivery, 0 if settled else REJECTED, DECODE, f"no mirror transfer of kind {kind!r}")

    def _applied(self, delivery: Any) -> None:
        if not self.link.closed:
            self.link.settle(delivery, ACCEPTED)

    def on_detach(self) -> None:
        self.mirrored.links -= 1
