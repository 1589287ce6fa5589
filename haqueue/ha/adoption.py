"""Adoption: a new primary takes in the messages a rejoining backup holds that it never had.

A message confirmed under the floor is held by a majority. A new primary is one broker of some majority,
not necessarily one that holds every confirmed message: under a quorum mode the votes of one queue may
come from one backup and those of another from the other, and under a flapping partition a backup may
follow the old primary again, for a moment, after another broker was chosen to replace it. Those
messages are in the old epoch's seq range, above what the new primary held when promoted: "never here"
(design/replication.md, "Divergence"). Any majority the new primary confirms with holds a broker that
has them, so that broker's rejoin is where they are recovered: it sends them on `$ha.adopt/<queue>`,
the primary enqueues each as a new message (replicated, journalled, held by the floor like a publish)
and settles it once its copy is safe; only then does the backup remove its own copy.

Only messages the broker received as a backup are adopted. Those it numbered itself, as the primary of
their epoch, were never replicated (else a backup would bring them): none was confirmed under the
floor, and a client may have sent them again elsewhere, so they are kept aside instead (quarantine.py).
A message two backups bring is adopted once: the primary remembers the old seqs it adopted in this epoch
and tells a later holder to remove them (`D`). That record is in memory: after another failover, a
broker rejoining with such a message brings it again (a duplicate at worst, never a loss).
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable

from ..broker.completion import Completion
from ..broker.connection import Connection
from ..broker.message import expiry
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import Queue, seq_ranges
from . import protocol

log = logging.getLogger("haqueue.ha.adoption")


# -- the backup's end ------------------------------------------------------------------------------
class Giver(LinkHandler):
    """Sends the primary one queue's messages it never had, each unsettled; `done(seq)` once the primary
    settled it accepted (its copy is safe there): the caller removes its own."""

    def __init__(self, conn: Connection, queue: Queue, messages: list[tuple[int, bytes]],
                 properties: dict[str, Any], done: Callable[[int], None]) -> None:
        self.waiting = deque(messages)
        self.sent: dict[int, int] = {}  # delivery -> old seq
        self.done = done
        address = f"{protocol.ADOPT}/{queue.name}"
        self.link = conn.open_link(True, address, address, self, properties={**properties, protocol.UID: queue.uid})

    def on_credit(self) -> None:
        link, sent = self.link, self.sent
        while self.waiting and link.credit() > 0:
            seq, data = self.waiting.popleft()
            delivery = link.send(data, tag=protocol.message_tag(protocol.ADOPTED, seq, 0))
            if delivery is not None:
                sent[delivery] = seq

    def on_outcome(self, delivery: Any, outcome: int, failed: bool, undeliverable: bool) -> None:
        seq = self.sent.pop(delivery, None)
        if seq is not None and outcome == ACCEPTED:
            self.done(seq)
        if not self.waiting and not self.sent:
            self.link.close()


# -- the primary's end -----------------------------------------------------------------------------
class Adoptions:
    """What this primary adopted in its epoch: per queue, old seq -> None once its copy is confirmed, else the
    settlements waiting for that."""

    def __init__(self) -> None:
        self.queues: dict[Queue, dict[int, list[Callable[[], None]] | None]] = {}
        self.total = 0  # messages adopted since promotion (status, metrics)

    def adopt(self, queue: Queue, seq: int, data: bytes, safe: Callable[[], None]) -> None:
        """Enqueue the message unless adopted already; call `safe` once this primary's copy is confirmed."""
        adopted = self.queues.setdefault(queue, {})
        if seq in adopted:
            waiting = adopted[seq]
            if waiting is None:
                safe()
            else:
                waiting.append(safe)
            return
        adopted[seq] = [safe]
        self.total += 1
        completion = Completion(lambda: self._confirmed(queue, seq))
        queue.enqueue(data, expiry(data), completion)
        completion.release()

    def _confirmed(self, queue: Queue, seq: int) -> None:
        adopted = self.queues.get(queue)
        waiting = adopted.get(seq) if adopted is not None else None
        if adopted is None or waiting is None:
            return
        adopted[seq] = None
        for safe in waiting:
            safe()

    def confirmed(self, queue: Queue) -> list[tuple[int, int]]:
        """The old seqs of this queue adopted and confirmed here, as runs."""
        adopted = self.queues.get(queue)
        return seq_ranges(sorted(s for s, waiting in adopted.items() if waiting is None)) if adopted else []

    def forget(self, queue: Queue) -> None:
        self.queues.pop(queue, None)


class Taker(LinkHandler):
    """The primary's end of a backup's `$ha.adopt/<queue>` link."""

    def __init__(self, adoptions: Adoptions, backup: str, queue: Queue, link: Link) -> None:
        self.adoptions = adoptions
        self.backup = backup
        self.queue = queue
        self.link = link
        self.count = 0

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        _, seq, _ = protocol.read_tag(Link.tag(delivery))
        if self.count == 0:
            log.warning("backup %s holds messages of queue '%s' from an earlier epoch that this primary never had "
                        "(they were confirmed, or may have been, while it was elsewhere): adopting them",
                        self.backup, self.queue.name)
        self.count += 1
        self.adoptions.adopt(self.queue, seq, data, lambda: self._settle(delivery))

    def _settle(self, delivery: Any) -> None:
        if not self.link.closed:
            self.link.settle(delivery, ACCEPTED)

    def on_detach(self) -> None:
        if self.count:
            log.info("adopted %d messages of queue '%s' from backup %s", self.count, self.queue.name, self.backup)
