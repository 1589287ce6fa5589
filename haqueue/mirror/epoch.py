"""The standby's mirror epoch (design/mirroring.md, "Epochs and fencing"): the highest epoch it knows (a source's it
accepted, or its own once promoted), whether it was promoted (and then what it held of each source queue), and
whether it was reversed: it mirrors back, as a source at its own epoch, to the cluster it was promoted over.

It is kept as the one message of the queue RECORD on the standby, so it is durable and replicated exactly as any
message of that cluster (its journal, its HA backups): it survives the standby's restarts and failovers with no
file, format or HA record of its own, and a promotion is answered once the standby's guards hold it. A newer
record is enqueued before the older is dequeued: after a crash between the two, the newest (highest seq) counts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Final

from proton import Message

from ..broker.completion import Completion
from ..broker.errors import NOT_ALLOWED, BrokerError
from ..broker.management import Answer, Deferred, Management, Operation
from ..broker.queue import Queue
from ..broker.registry import Registry
from . import protocol

RECORD: Final = "$mirror.epoch"  # the queue (clients may not touch it: target.py)
RECORD_ARGS: Final = {"durable": True, "x-replicate": "all"}
REMOVING: Final = ("DELETE", "PURGE")  # management's operations on a queue that would drop the record


@dataclass(frozen=True)
class Epoch:
    epoch: int = 0  # the highest mirror epoch known here
    promoted_at: float | None = None  # when this cluster was promoted (unix time); None: its mirror queues read-only
    # At the promotion: per mirror queue, the newest source seq it held. Every message the source held up to it was
    # mirrored (the source sends in seq order and the standby applies in order): what the old source holds past it
    # is what it never mirrored, kept aside when the old source's queue becomes a mirror (mirror reverse).
    applied: dict[str, int] = field(default_factory=dict)
    reverses: str | None = None  # reversed: the cluster this one mirrors back to, at mirror epoch `epoch`

    @property
    def promoted(self) -> bool:
        return self.promoted_at is not None

    def fence(self, source: str, epoch: int, reverse: bool) -> str | None:
        """Why a source cluster mirroring at `epoch` is refused here, or None. Once promoted, only a newer epoch's
        source reversing onto this cluster (`reverse`: its promotion's fail-back) may feed it."""
        if self.promoted_at is not None and (epoch <= self.epoch or not reverse):
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.promoted_at))
            if epoch > self.epoch:
                return (f"fenced: this cluster was promoted at mirror epoch {self.epoch} ({when}); cluster "
                        f"'{source}' mirrors at epoch {epoch} but not as a reverse onto it: only the cluster it was "
                        f"promoted over, itself promoted, may feed it (mirror reverse)")
            return (f"fenced: this standby was promoted at mirror epoch {self.epoch} ({when}); cluster '{source}' "
                    f"mirrors at epoch {epoch}, from before it: it may not feed this cluster again (make it a "
                    f"standby of this one)")
        if epoch < self.epoch:
            return f"fenced: cluster '{source}' mirrors at epoch {epoch}, older than this standby's {self.epoch}"
        return None

    def raise_to(self, epoch: int) -> "Epoch":
        """A source accepted at `epoch`, newer than any before: this cluster is its standby (a promotion, or a
        reverse, at an older epoch is over)."""
        return Epoch(epoch) if epoch > self.epoch else self

    def promote(self, applied: dict[str, int]) -> "Epoch":
        return Epoch(max(self.epoch, protocol.FIRST_EPOCH) + 1, time.time(), applied)

    def reverse(self, cluster: str) -> "Epoch":
        """Mirroring back to `cluster`, at an epoch above the promotion's (which fenced it off)."""
        return Epoch(self.epoch + 1, self.promoted_at, self.applied, cluster)


class EpochRecord:
    """The record, read from its queue when first needed (after a start, or a promotion in the standby cluster)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._known: Epoch | None = None
        self.listeners: list[Callable[[], None]] = []  # told after each write (the source starts or stops)

    def read(self) -> Epoch:
        if self._known is None:
            queue = self.registry.lookup(RECORD)
            entries = queue.entries() if isinstance(queue, Queue) else []
            self._known = Epoch()
            if entries:
                message = Message()
                message.decode(entries[-1].data)
                body: dict[str, Any] = message.body  # type: ignore[assignment]  # written by write()
                self._known = Epoch(int(body["epoch"]), body.get("promoted_at"),
                                    {str(k): int(v) for k, v in (body.get("applied") or {}).items()},
                                    body.get("reverses"))
        return self._known

    def forget(self) -> None:
        """Read it again when next needed: this broker was promoted in its own cluster."""
        self._known = None

    def write(self, epoch: Epoch, confirmed: Completion | None = None) -> None:
        """Keep `epoch`; `confirmed` is released once the standby's guards (disk, backups) hold it."""
        queue = self.registry.declare_queue(RECORD, dict(RECORD_ARGS))[0]
        older = queue.live_seqs()
        data = Message(body={"epoch": epoch.epoch, "promoted_at": epoch.promoted_at, "applied": epoch.applied,
                             "reverses": epoch.reverses}, durable=True).encode()
        queue.enqueue(bytes(data), 0.0, confirmed)
        if confirmed is not None:
            confirmed.release()
        for seq in older:
            queue.dequeue_range(seq, seq)
        self._known = epoch
        for listener in self.listeners:
            listener()


def guard(management: Management) -> None:
    """Management's delete and purge of a queue refuse RECORD (an admin's, as any): either would drop the epoch, and
    with it the fence, so that a source this cluster was promoted over could feed it again at its old epoch."""
    for operation in REMOVING:
        key = ("queue", operation)
        handler, needs = management.operations[key]
        management.register("queue", operation, _refusing(handler, operation), needs)
        deferred = management.deferred.get(key)
        if deferred is not None:
            management.deferred[key] = _refusing_deferred(deferred, operation)


def _check(name: str | None, operation: str) -> None:
    if name == RECORD:
        raise BrokerError(NOT_ALLOWED, f"queue '{RECORD}' holds this cluster's mirror epoch, its fence against the "
                                       f"sources it was promoted over: an admin may not {operation.lower()} it "
                                       f"(design/mirroring.md, \"Epochs and fencing\")")


def _refusing(handler: Operation, operation: str) -> Operation:
    def refusing(name: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        _check(name, operation)
        return handler(name, body)
    return refusing


def _refusing_deferred(deferred: Deferred, operation: str) -> Deferred:
    def refusing(name: str | None, body: dict[str, Any], user: str | None, answer: Answer) -> None:
        _check(name, operation)  # raised: answered as a refusal (Management.answer)
        deferred(name, body, user, answer)
    return refusing
