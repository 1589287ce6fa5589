"""Where each shard's primary is: the address the relay connects to for a shard's links.

With the cluster file's `shard_public`, shard i's direct address (port + i) is bound only by its primary,
as a VIP per shard would be (the local supervisor's public address, or Pacemaker's), so the address
itself follows failover: after one, the relay connects to the same address and reaches the new primary.
ZooKeeper's `primary` znode per shard is the other way to know (design/sharding.md, step 6).
"""
from __future__ import annotations

from collections.abc import Sequence


class ShardDirectory:
    def __init__(self, publics: Sequence[tuple[str, int]]) -> None:
        self._publics = list(publics)

    def primary(self, shard: int) -> tuple[str, int]:
        """The address at which shard `shard`'s primary serves, once there is one."""
        return self._publics[shard]
