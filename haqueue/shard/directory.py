"""Where each shard's primary is: the address the relay connects to for a shard's links.

Shard i's direct address follows its primary: with the cluster file's `shard_public` (port + i) it is bound
only by the primary (the local supervisor's public address), under Pacemaker it is the shard's VIP, which
Pacemaker keeps on the promoted instance's node. So after a failover the relay connects to the same address
and reaches the new primary.
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
