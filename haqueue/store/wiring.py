"""WiringJournal: the registry observer that journals durable queues, exchanges and bindings, and the
snapshot of them that starts every segment (design/store.md)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..broker.exchange import Binding, Exchange
from ..broker.queue import Queue
from ..broker.registry import Registry
from . import records


class Journalled(Protocol):
    """A durable queue's journal (store.QueueJournal), as the wiring records name it."""

    qid: int


def durable_exchange(exchange: Exchange) -> bool:
    return exchange.args.get("durable", True) is not False


class WiringJournal:
    """`append`: the store's, for a record; `journals`: the durable queues' (the store's, read only here);
    `forget`: takes a deleted queue's journal out of them."""

    def __init__(self, append: Callable[[bytes], None], journals: Mapping[Queue, Journalled],
                 forget: Callable[[Queue], Journalled | None], registry: Registry) -> None:
        self.append, self.journals, self.forget, self.registry = append, journals, forget, registry
        self.exchanges: set[str] = set()  # the durable exchanges, by name

    def declared(self, node: Queue | Exchange | Binding) -> None:
        record = self._declaration(node)
        if record is not None:
            self.append(record)

    def deleted(self, node: Queue | Exchange | Binding) -> None:
        if isinstance(node, Queue):
            journal = self.forget(node)
            if journal is not None:
                self.append(records.queue_deleted(journal.qid))
        elif isinstance(node, Exchange):
            if node.name in self.exchanges:
                self.exchanges.discard(node.name)
                self.append(records.wiring(records.EXCHANGE_DELETED, {"name": node.name, "uid": node.uid}))
        elif self._durable(node):
            self.append(records.wiring(records.UNBOUND, {"exchange": node.exchange.name,
                                                         "queue": node.queue.name, "key": node.key}))

    def snapshot(self) -> list[bytes]:
        """Every durable exchange, queue and binding, in an order recovery can declare them in."""
        registry = self.registry
        nodes: list[Any] = [*registry.exchanges(), *registry.queues(), *registry.bindings()]
        return [r for r in map(self._declaration, nodes) if r is not None]

    def _declaration(self, node: Queue | Exchange | Binding) -> bytes | None:
        if isinstance(node, Queue):
            journal = self.journals.get(node)
            if journal is None:
                return None
            return records.wiring(records.QUEUE, {"name": node.name, "uid": node.uid, "args": node.args},
                                  qid=journal.qid)
        if isinstance(node, Exchange):
            if not durable_exchange(node):
                return None
            self.exchanges.add(node.name)
            return records.wiring(records.EXCHANGE, {"name": node.name, "type": node.type, "uid": node.uid,
                                                     "args": node.args})
        if not self._durable(node):
            return None
        return records.wiring(records.BINDING, {"exchange": node.exchange.name, "queue": node.queue.name,
                                                "key": node.key, "uid": node.uid, "args": node.args})

    def _durable(self, binding: Binding) -> bool:
        return binding.queue in self.journals and binding.exchange.name in self.exchanges
