"""Where each shard's replicas go: shard i on the nodes (i + j) mod n, j = 0..R-1, the first its preferred
primary, skipping nodes whose rack already holds a replica of the shard (design/sharding.md).

Pure functions of their arguments: the same input gives the same placement on every machine and run.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ShardError
from .topology import Topology

Assignment = tuple[tuple[str, ...], ...]  # shard i's nodes, its preferred primary first


@dataclass(frozen=True)
class Move:
    """A replica of `shard` leaves `source` for `target`, which must copy (catch up on) the shard."""
    shard: int
    source: str
    target: str


@dataclass(frozen=True)
class Placement:
    shards: Assignment
    nodes: tuple[str, ...]  # the nodes it was made for, holding replicas or not
    moves: tuple[Move, ...] = ()  # replicas moved from an earlier assignment (rebalance.py)
    leader_changes: tuple[Move, ...] = ()  # preferred primaries changed, each a failover once applied
    warnings: tuple[str, ...] = ()  # what the placement could not do (racks too few)


def check_counts(topology: Topology, shards: int, replicas: int) -> None:
    if shards < 1:
        raise ShardError(f"shards must be at least 1, got {shards}")
    if replicas < 1:
        raise ShardError(f"replicas must be at least 1, got {replicas}")
    if replicas > len(topology.nodes):
        raise ShardError(f"{replicas} replicas need {replicas} nodes, but there are only {len(topology.nodes)} "
                         f"({', '.join(topology.nodes)}): each replica of a shard is on its own node")


def place(topology: Topology, shards: int, replicas: int) -> Placement:
    check_counts(topology, shards, replicas)
    order = topology.placement_order()
    n = len(order)
    assignment = []
    for i in range(shards):
        # Walk on from the preferred primary; each replica is the nearest node whose rack (then region)
        # holds the fewest replicas of the shard so far: distinct racks while there are enough.
        walk = [order[(i + step) % n] for step in range(n)]
        chosen = [walk[0]]
        for _ in range(replicas - 1):
            chosen.append(min((node for node in walk if node not in chosen),
                              key=lambda node: domain_cost(topology, chosen, node)))
        assignment.append(tuple(chosen))
    shortage = topology.rack_shortage(replicas)
    return Placement(tuple(assignment), topology.nodes, warnings=(shortage,) if shortage else ())


def domain_cost(topology: Topology, replicas: Sequence[str], node: str) -> tuple[int, int]:
    """How much a replica on `node` would share failure domains with `replicas`: (same rack, same region).
    Lower is safer; min() over candidates in walk order keeps the nearest of the safest."""
    racks = Counter(topology.rack(r) for r in replicas)
    regions = Counter(topology.region(r) for r in replicas)
    return racks[topology.rack(node)], regions[topology.region(node)]
