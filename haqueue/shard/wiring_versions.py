"""Which state of a broadcast wiring object is the newer, across shards (design/sharding.md, "Deletes converge").

Each CREATE or DELETE of an exchange, binding or queue broadcast to the shards carries a stamp, the entry process's
wall-clock time. A shard's primary applying a CREATE of something new gives the object that stamp as its argument
`x-shard-stamp`; applying a DELETE, it keeps a **tombstone**: a queue `$shard.deleted/<digest>` (empty, wiring only,
so HA replicates it to the shard's backups and the store keeps it like any queue) whose arguments name the deleted
object and the stamp, kept when the object is made again (a shard that missed both must still drop what it holds
of the old one). When a shard converges on another's wiring (wiring_sync.py) the newer stamp wins: a tombstone newer
than an object removes it, with what a delete takes with it (an exchange's or queue's bindings), and an object
newer than a tombstone is made again. Tombstones older than RETENTION are dropped when the shard's primary is
promoted.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from ..broker.errors import NOT_ALLOWED, BrokerError
from ..broker.exchange import Exchange
from ..broker.proton_adapter import Link, LinkHandler
from ..broker.registry import Registry
from ..broker.server import Broker
from ..ha.policy import ARGUMENT as REPLICATE, CONFIGURATION

STAMP = "x-shard-stamp"  # a broadcast request's property, and the argument of what it created: seconds since 1970
TOMBSTONES = "$shard.deleted"  # the prefix of the tombstones' queue names
DELETED = "x-shard-deleted"  # a tombstone's argument: the deleted object's key, as JSON
RETENTION = 7 * 24 * 3600.0  # a shard without a primary for longer may keep what the others deleted

# ("exchange", name), ("queue", name) or ("binding", exchange, queue, key)
Key = tuple[str, ...]


def key_of(type_: str, name: Any, body: dict[str, Any]) -> Key | None:
    """The key of the object a management request on `type_` concerns (None: not a broadcast type)."""
    if type_ == "binding":
        return "binding", str(body.get("exchange")), str(body.get("queue")), str(body.get("key", "") or "")
    if type_ in ("exchange", "queue"):
        return type_, str(name)
    return None


def stamp_of(args: dict[str, Any]) -> float:
    """When an object was created by a broadcast; 0 for any other (the cluster file's, auto-created, or one whose
    declare gave the argument itself, not a number)."""
    stamp = args.get(STAMP, 0)
    return float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else 0.0


def exists(registry: Registry, key: Key) -> bool:
    if key[0] == "binding":
        exchange = registry.lookup(key[1])
        return isinstance(exchange, Exchange) and (key[2], key[3]) in exchange.bindings
    node = registry.lookup(key[1])
    return node is not None and node.kind == key[0]


def _name(key: Key) -> str:
    return f"{TOMBSTONES}/{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}"


def tombstones(registry: Registry) -> dict[Key, float]:
    """This shard's tombstones: each deleted object's key and the stamp of its delete."""
    found: dict[Key, float] = {}
    for queue in registry.queues():
        if queue.name.startswith(TOMBSTONES + "/") and DELETED in queue.args:
            try:
                key = json.loads(queue.args[DELETED])
            except (TypeError, ValueError):
                continue  # not one of ours: declared by hand with the argument
            if isinstance(key, list):
                found[tuple(str(part) for part in key)] = stamp_of(queue.args)
    return found


def record(registry: Registry, key: Key, stamp: float) -> None:
    """Keep the tombstone of `key` deleted at `stamp` (replacing an older one)."""
    name = _name(key)
    found = registry.lookup(name)
    if found is not None:
        if stamp_of(found.args) >= stamp:
            return
        registry.delete(name)
    registry.declare_queue(name, {DELETED: json.dumps(key), STAMP: stamp, REPLICATE: CONFIGURATION})


def prune(registry: Registry, now: float) -> None:
    for key, stamp in tombstones(registry).items():
        if stamp < now - RETENTION:
            registry.delete(_name(key))


def guard(broker: Broker) -> None:
    """No link may attach to a tombstone: consuming or deleting one is for the shard plug-in only."""
    def refuse(link: Link) -> LinkHandler:
        raise BrokerError(NOT_ALLOWED, f"{link.address} is a shard's record of a delete")
    broker.endpoints[TOMBSTONES] = refuse
