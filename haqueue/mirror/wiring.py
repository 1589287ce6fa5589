"""The source's wiring into its mirrored queues, mirrored (design/mirroring.md, "Wiring"): the exchanges bound to a
mirrored queue and those bindings, so that a promoted standby routes as the source did.

It goes whole, not as events: on `$mirror.wiring` (protocol 2), once per connection and again WIRING_DELAY after
any change, the source sends its snapshot (a map); the standby makes its own wiring of that source match it. So a
change made while the link was down needs no replay, and a standby failover none either (the standby's wiring is
replicated and journalled as any). On the standby a mirrored exchange carries the source's mark (protocol.SOURCE_ARG);
one of its own of the same name is left alone (said in the log), unless the source reverses onto this cluster: then
it is given the source's bindings into the mirror queues (and keeps its others). A binding to a mirror queue not
declared yet is made when the queue is.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Final

from ..broker.exchange import Exchange
from ..broker.proton_adapter import ACCEPTED, Link, LinkHandler
from ..broker.queue import Queue
from ..broker.registry import Registry
from ..ha.protocol import decode_map, encode_map
from . import protocol

log = logging.getLogger("haqueue.mirror")

WIRING_DELAY: Final = 0.05  # seconds a change waits for others to go in the same snapshot


def snapshot(registry: Registry, mirrored: Callable[[str], bool]) -> dict[str, Any]:
    """The exchanges bound to a queue `mirrored` says is, with their types and arguments, and those bindings."""
    exchanges: dict[str, Any] = {}
    bindings = []
    for exchange in registry.exchanges():
        for binding in exchange.bindings.values():
            if mirrored(binding.queue.name):
                exchanges[exchange.name] = {"type": exchange.type, "args": dict(exchange.args)}
                bindings.append([exchange.name, binding.queue.name, binding.key, dict(binding.args)])
    return {"exchanges": exchanges, "bindings": bindings}


class WiringSender(LinkHandler):
    """The source's end of `$mirror.wiring`: the latest snapshot, sent once the standby grants credit."""

    def __init__(self) -> None:
        self.link: Link | None = None
        self.due: bytes | None = None

    def send(self, wiring: dict[str, Any]) -> None:
        self.due = encode_map(wiring)
        self.on_credit()

    def on_credit(self) -> None:
        if self.link is not None and self.due is not None and self.link.credit() > 0:
            self.link.send(self.due, settled=True)
            self.due = None

    def on_detach(self) -> None:
        self.link = None


class WiringReceiver(LinkHandler):
    """The standby's end of `$mirror.wiring`: each snapshot applied as it comes."""

    def __init__(self, link: Link, apply: Callable[[dict[str, Any]], None]) -> None:
        self.link = link
        self.apply = apply

    def on_message(self, delivery: Any, data: bytes, settled: bool) -> None:
        self.link.settle(delivery, 0 if settled else ACCEPTED)
        self.apply(decode_map(data))


def apply(registry: Registry, source: str, wiring: dict[str, Any], reverse: bool) -> None:
    """Make the standby's wiring of cluster `source` what `wiring` (its snapshot) says. With `reverse` (the source
    reverses onto this cluster, whose queues became its mirrors: reverse.py), an exchange of this cluster's own of a
    name the source's wiring has is given the source's bindings into those mirrors (and keeps its others)."""
    exchanges: dict[str, Any] = wiring.get("exchanges") or {}
    wanted = {(str(e), str(q), str(k)): dict(args or {}) for e, q, k, args in wiring.get("bindings") or []}
    for exchange in registry.exchanges():
        spec = exchanges.get(exchange.name)
        if _marked(exchange, source) and (spec is None or spec["type"] != exchange.type):
            registry.delete(exchange.name, "exchange")  # gone at the source (or made again of another type)
    for name, spec in exchanges.items():
        node = registry.lookup(name)
        if node is None:
            registry.declare_exchange(name, spec["type"], {**(spec.get("args") or {}), protocol.SOURCE_ARG: source})
        elif not (isinstance(node, Exchange) and (_marked(node, source) or reverse)):
            log.warning("mirror: '%s' here is not cluster %s's exchange: its wiring of it is not mirrored", name,
                        source)
    for exchange in registry.exchanges():
        if _marked(exchange, source):
            for queue, key in list(exchange.bindings):
                if (exchange.name, queue, key) not in wanted:
                    registry.unbind(exchange.name, queue, key)
    for (name, queue, key), args in wanted.items():
        node, target = registry.lookup(name), registry.lookup(queue)
        if isinstance(node, Exchange) and (_marked(node, source) or reverse) and isinstance(target, Queue) \
                and target.args.get(protocol.SOURCE_ARG) == source:
            registry.bind(name, queue, key, args)


def _marked(exchange: Exchange, source: str) -> bool:
    return exchange.args.get(protocol.SOURCE_ARG) == source
