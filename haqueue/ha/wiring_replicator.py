"""WiringReplicator: the backup's end of `$ha.wiring`. Makes the local queues, exchanges and bindings
equal to the primary's: the snapshot replaces everything but this broker's temporary queues (deleting what
the primary lacks, and re-creating an object whose unique id differs: the same name, but a different queue),
then live declare/delete events keep it equal."""
from __future__ import annotations

import logging
from typing import Any, Iterable, Protocol

from ..broker.errors import BrokerError
from ..broker.exchange import Exchange
from ..broker.proton_adapter import ACCEPTED, LinkHandler
from ..broker.queue import Queue
from ..broker.registry import Registry
from . import protocol
from .policy import MESSAGE_LEVELS
from .quorum import ALL, from_disk

log = logging.getLogger("haqueue.ha.wiring")


class WiringHost(Protocol):
    """What the WiringReplicator needs of the backup that runs it (backup.Backup): it never imports the backup."""

    members: dict[str, str]  # the cluster's brokers and their states, as the primary last said
    from_disk: bool  # the primary's sync mode asks for confirmations from the journal's disk

    @property
    def registry(self) -> Registry: ...

    def accept_primary(self, name: str, epoch: int) -> bool:
        """Called with the primary's snapshot: False if that primary is older than one already seen."""

    def wiring_synced(self) -> None: ...

    def replicate(self, queue: Queue, fresh: bool = False) -> None: ...

    def stop_replicating(self, queue: Queue) -> None: ...

    def first(self, name: str) -> None:
        """The primary holds a publish on this queue for this backup: subscribe to it before the others."""

    def wiring_detached(self, error: str | None) -> None: ...

    def cluster_features(self, enabled: Iterable[str]) -> None:
        """The feature flags enabled in the cluster, as the primary says."""


class WiringReplicator(LinkHandler):
    def __init__(self, backup: WiringHost) -> None:
        self.backup = backup
        self.registry = backup.registry
        self.link: Any = None
        self.parts: list[dict[str, Any]] = []  # a snapshot's parts received so far, until it is whole

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        event = protocol.decode_map(data)
        kind = event.get("event")
        try:
            if kind == "snapshot" or kind == "snapshot-part":
                self._snapshot_part(event)
            elif kind == "declare":
                self._declare(event)
            elif kind == "delete":
                self._delete(event)
            elif kind == "membership":
                self.backup.members = dict(event.get("members") or {})
            elif kind == "features":
                self.backup.cluster_features(event.get("enabled") or ())
            elif kind == "first":
                self.backup.first(str(event.get("queue")))
        except BrokerError as e:
            log.error("cannot apply wiring event %s: %s", kind, e.description)
        self.link.settle(delivery, 0 if settled else ACCEPTED)

    def _snapshot_part(self, event: dict[str, Any]) -> None:
        if event["event"] == "snapshot":
            self.parts = []
        elif not self.parts:
            return  # a part of a snapshot whose start this link never saw
        self.parts.append(event)
        if len(self.parts) < int(self.parts[0].get("parts") or 1):
            return
        whole = dict(self.parts[0])
        for kind in ("queues", "exchanges", "bindings"):
            whole[kind] = [d for part in self.parts for d in part.get(kind, ())]
        self.parts = []
        self._snapshot(whole)

    def _snapshot(self, event: dict[str, Any]) -> None:
        if not self.backup.accept_primary(str(event.get("primary")), int(event.get("epoch") or 0)):
            return
        self.backup.members = dict(event.get("members") or {})
        self.backup.from_disk = from_disk(str(event.get("sync") or ALL))
        wanted_nodes = {d["name"]: d for d in event["queues"] + event["exchanges"]}
        for node in list(self.registry.nodes.values()):
            if isinstance(node, Queue) and node.temporary:
                continue  # this broker's own (an admin tool's reply queue): the primary replicates none
            wanted = wanted_nodes.get(node.name)
            if wanted is None or wanted["uid"] != node.uid or wanted["kind"] != node.kind:
                self._remove(node.name)
        for description in event["exchanges"] + event["queues"]:
            self._declare(description, live=False)
        wanted_bindings = {(b["exchange"], b["queue"], b["key"]): b for b in event["bindings"]}
        for binding in self.registry.bindings():
            key = (binding.exchange.name, binding.queue.name, binding.key)
            if key not in wanted_bindings or wanted_bindings[key]["uid"] != binding.uid:
                self.registry.unbind(*key)
        for description in event["bindings"]:
            self._declare(description, live=False)
        self.backup.wiring_synced()

    def _declare(self, d: dict[str, Any], live: bool = True) -> None:
        """`live`: declared on the primary after the snapshot, so the queue started empty there and the
        primary holds its publishes until this backup has them: nothing to catch up for readiness."""
        kind = d["kind"]
        if kind == "binding":
            self.registry.bind(d["exchange"], d["queue"], d["key"], dict(d["args"]), uid=d["uid"])
            return
        existing = self.registry.lookup(d["name"])
        if existing is not None and existing.uid != d["uid"]:
            self._remove(d["name"])
        if kind == "queue":
            queue, _ = self.registry.declare_queue(d["name"], dict(d["args"]), uid=d["uid"])
            if d.get("replicate") in MESSAGE_LEVELS:
                self.backup.replicate(queue, fresh=live)
        else:
            self.registry.declare_exchange(d["name"], d["type"], dict(d["args"]), uid=d["uid"])

    def _delete(self, d: dict[str, Any]) -> None:
        if d["kind"] == "binding":
            exchange = self.registry.lookup(d["exchange"])
            if isinstance(exchange, Exchange) and (d["queue"], d["key"]) in exchange.bindings:
                self.registry.unbind(d["exchange"], d["queue"], d["key"])
            return
        node = self.registry.lookup(d["name"])
        if node is not None and node.uid == d["uid"]:
            self._remove(d["name"])

    def _remove(self, name: str) -> None:
        node = self.registry.lookup(name)
        if isinstance(node, Queue):
            self.backup.stop_replicating(node)
        self.registry.delete(name)

    def on_detach(self) -> None:
        self.backup.wiring_detached(self.link.remote_error() if self.link is not None else None)
