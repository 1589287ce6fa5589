"""Forwarding queues (design/sharding.md, step 4): in every shard but a queue's owner, a queue of the same name
that only exchange routing fills and the forwarder (forwarder.py) empties into the owner. Its argument
`x-shard-forward` names the owning shard; a client's link to the name is relayed there (routing.py).
"""
from __future__ import annotations

from typing import Any, Callable

from ..broker.queue import Queue
from .wiring_versions import STAMP

FORWARD = "x-shard-forward"
# Arguments of the declared queue its forwarding queues share: kept on disk and replicated as it is, and made by
# the same broadcast (wiring_versions.py).
SHARED = ("durable", "x-replicate", STAMP)


def validator(shard: int, shards: int) -> Callable[[str, str, dict[str, Any]], str | None]:
    """A registry validator for shard `shard` of `shards`: a forwarding queue forwards to another shard."""
    def check(kind: str, name: str, args: dict[str, Any]) -> str | None:
        owner = args.get(FORWARD)
        if owner is None:
            return None
        if isinstance(owner, bool) or not isinstance(owner, int) or not 0 <= owner < shards or owner == shard:
            return f"{FORWARD} must name another shard (0 to {shards - 1}, not {shard}), got {owner!r}"
        return None
    return check


def forwarded_to(node: Any) -> int | None:
    """The shard a forwarding queue forwards to; None for any other node (or none)."""
    if isinstance(node, Queue) and FORWARD in node.args:
        return int(node.args[FORWARD])
    return None


def forwarding_args(owner: int, declared: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a forwarding queue for a queue of shard `owner` declared with `declared`."""
    return {FORWARD: owner, **{key: declared[key] for key in SHARED if key in declared}}
