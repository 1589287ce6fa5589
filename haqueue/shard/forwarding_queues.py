"""Forwarding queues (design/sharding.md, step 4): in every shard but a queue's owner, a queue of the same name
that only exchange routing fills and the forwarder (forwarder.py) empties into the owner. Its argument
`x-shard-forward` names the owning shard; a client's link to the name is relayed there (routing.py).
"""
from __future__ import annotations

from typing import Any

from ..broker.queue import Queue

FORWARD = "x-shard-forward"
# Arguments of the declared queue its forwarding queues share: kept on disk and replicated as it is.
SHARED = ("durable", "x-replicate")


def forwarded_to(node: Any) -> int | None:
    """The shard a forwarding queue forwards to; None for any other node (or none)."""
    if isinstance(node, Queue) and FORWARD in node.args:
        return int(node.args[FORWARD])
    return None


def forwarding_args(owner: int, declared: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a forwarding queue for a queue of shard `owner` declared with `declared`."""
    return {FORWARD: owner, **{key: declared[key] for key in SHARED if key in declared}}
