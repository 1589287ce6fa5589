"""WiringJournal: the registry observer that journals durable queues, exchanges and bindings, and the
snapshot of them that starts every segment (design/store.md)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..broker.exchange import Binding, Exchange
from ..broker.queue import Queue
from . import records

if TYPE_CHECKING:
    from .store import Store


def durable_exchange(exchange: Exchange) -> bool:
    return exchange.args.get("durable", True) is not False


class WiringJournal:
    def __init__(self, store: "Store") -> None:
        self.store = store
        self.exchanges: set[str] = set()  # the durable exchanges, by name

    def declared(self, node: Queue | Exchange | Binding) -> None:
        record = self._declaration(node)
        if record is not None:
            self.store.append(record)

    def deleted(self, node: Queue | Exchange | Binding) -> None:
        if isinstance(node, Queue):
            journal = self.store.journals.pop(node, None)
            if journal is not None:
                self.store.append(records.queue_deleted(journal.qid))
        elif isinstance(node, Exchange):
            if node.name in self.exchanges:
                self.exchanges.discard(node.name)
                self.store.append(records.wiring(records.EXCHANGE_DELETED, {"name": node.name, "uid": node.uid}))
        elif self._durable(node):
            self.store.append(records.wiring(records.UNBOUND, {"exchange": node.exchange.name,
                                                               "queue": node.queue.name, "key": node.key}))

    def snapshot(self) -> list[bytes]:
        """Every durable exchange, queue and binding, in an order recovery can declare them in."""
        registry = self.store.broker.registry
        nodes: list[Any] = [*registry.exchanges(), *registry.queues(), *registry.bindings()]
        return [r for r in map(self._declaration, nodes) if r is not None]

    def _declaration(self, node: Queue | Exchange | Binding) -> bytes | None:
        if isinstance(node, Queue):
            journal = self.store.journals.get(node)
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
        return binding.queue in self.store.journals and binding.exchange.name in self.exchanges
