"""A new assignment when nodes are added or removed, moving as few replicas as possible.

What must move: every replica on a node that is gone, and a replica sharing a rack that need not be
shared (racks given since). Each is one move. What an added (empty) node must take to do its share:
floor(K·R / n) replicas, each one move. So no rebalancing moves fewer than max(must move, empty nodes ×
floor(K·R / n)) replicas, and this one moves that many: the displaced replicas go to the empty nodes
first, and only what they still lack is taken from the fullest nodes. Everything else stays where it is,
so rebalancing an assignment onto its own nodes moves nothing. Preferred primaries are then evened out
among each shard's replicas, which moves no data (each change is a preferred-primary failover).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .errors import ShardError
from .placement import Move, Placement, check_counts, domain_cost
from .topology import Topology


def rebalance(old: Sequence[Sequence[str]], topology: Topology) -> Placement:
    replicas = replica_count(old)
    check_counts(topology, len(old), replicas)
    shards, displaced = _keep(old, topology, replicas)
    order = topology.placement_order()
    rank = {node: i for i, node in enumerate(order)}
    load = Counter({node: 0 for node in order})
    load.update(node for nodes in shards for node in nodes)
    held_before = {node for nodes in old for node in nodes}
    empty = {node for node in order if node not in held_before}
    floor = len(old) * replicas // len(order)
    moves: list[Move] = []
    placed: set[tuple[int, str]] = set()  # replicas this rebalance put somewhere: never moved twice

    def moved(shard: int, source: str, target: str) -> None:
        if source != target:
            moves.append(Move(shard, source, target))
            placed.add((shard, target))
        load[target] += 1

    for shard, source in displaced:  # not counted in load: its node is gone or its rack is full
        nodes = shards[shard]
        target = min((node for node in order if node not in nodes),
                     key=lambda node: (domain_cost(topology, nodes, node),
                                       not (node in empty and load[node] < floor), load[node], rank[node]))
        nodes.append(target)
        moved(shard, source, target)
    _lead(old, shards)
    leaders = Counter(nodes[0] for nodes in shards)
    least_leaders = len(old) // len(order)
    for node in (n for n in order if n in empty):
        while load[node] < floor:
            taken = _take(shards, node, topology, load, leaders, floor, least_leaders, placed)
            if taken is None:
                break  # the racks allow no more: the node stays below its share
            shard, position = taken
            source = shards[shard][position]
            shards[shard][position] = node
            if position == 0:
                leaders[source] -= 1
                leaders[node] += 1
            load[source] -= 1
            moved(shard, source, node)
    _even_leaders(shards, leaders, rank)
    changes = tuple(Move(i, old[i][0], nodes[0]) for i, nodes in enumerate(shards) if nodes[0] != old[i][0])
    shortage = topology.rack_shortage(replicas)
    return Placement(tuple(tuple(nodes) for nodes in shards), tuple(moves), changes,
                     (shortage,) if shortage else ())


def replica_count(assignment: Sequence[Sequence[str]]) -> int:
    """R of a well-formed assignment: at least one shard, each with the same number of distinct nodes."""
    if not assignment:
        raise ShardError("the assignment has no shards")
    for i, nodes in enumerate(assignment):
        if not nodes:
            raise ShardError(f"shard {i} has no replicas")
        twice = next((node for node in nodes if list(nodes).count(node) > 1), None)
        if twice is not None:
            raise ShardError(f"shard {i} has node {twice!r} twice: each replica of a shard is on its own node")
        if len(nodes) != len(assignment[0]):
            raise ShardError(f"shard {i} has {len(nodes)} replicas but shard 0 has {len(assignment[0])}: "
                             f"every shard has the same number")
    return len(assignment[0])


def _keep(old: Sequence[Sequence[str]], topology: Topology,
          replicas: int) -> tuple[list[list[str]], list[tuple[int, str]]]:
    """Each shard's replicas that may stay, in their order, and those that must move: on a node that is
    gone, or over the most replicas of a shard one rack may hold (1 when racks are enough)."""
    per_rack = -(-replicas // topology.rack_count())
    present = set(topology.nodes)
    shards: list[list[str]] = []
    displaced: list[tuple[int, str]] = []
    for i, nodes in enumerate(old):
        kept: list[str] = []
        for node in nodes:
            if node in present and domain_cost(topology, kept, node)[0] < per_rack:
                kept.append(node)
            else:
                displaced.append((i, node))
        shards.append(kept)
    return shards, displaced


def _lead(old: Sequence[Sequence[str]], shards: list[list[str]]) -> None:
    """A shard whose preferred primary moved away is led by the replica with the fewest shards to lead."""
    leaders = Counter(nodes[0] for i, nodes in enumerate(shards) if nodes[0] == old[i][0])
    for i, nodes in enumerate(shards):
        if nodes[0] != old[i][0]:
            leader = min(nodes, key=lambda node: (leaders[node], nodes.index(node)))
            nodes.remove(leader)
            nodes.insert(0, leader)
            leaders[leader] += 1


def _take(shards: list[list[str]], node: str, topology: Topology, load: Counter[str], leaders: Counter[str],
          floor: int, least_leaders: int, placed: set[tuple[int, str]]) -> tuple[int, int] | None:
    """The replica an empty node should take next: from the fullest node above its share, where the move
    keeps the shard's racks as safe; a preferred primary while the node leads fewer than its share."""
    want_leader = leaders[node] < least_leaders
    best: tuple[tuple[int, ...], tuple[int, int]] | None = None
    for i, nodes in enumerate(shards):
        if node in nodes:
            continue
        for position, source in enumerate(nodes):
            if load[source] <= floor or (i, source) in placed:
                continue
            others = nodes[:position] + nodes[position + 1:]
            if domain_cost(topology, others, node) > domain_cost(topology, others, source):
                continue
            leads = position == 0
            fits = leads == (want_leader and leaders[source] > least_leaders)
            key = (not fits, -load[source], -leaders[source] if leads else 0, i, position)
            if best is None or key < best[0]:
                best = (key, (i, position))
    return None if best is None else best[1]


def _even_leaders(shards: list[list[str]], leaders: Counter[str], rank: dict[str, int]) -> None:
    """While a shard's preferred primary leads at least two more shards than another of its replicas,
    hand the lead to that replica (the widest gap first): no data moves, and leaders end balanced as far
    as the replicas allow. An assignment already within one changes nothing."""
    while True:
        best: tuple[tuple[int, int, int], int, str] | None = None
        for i, nodes in enumerate(shards):
            for node in nodes[1:]:
                gap = leaders[nodes[0]] - leaders[node]
                if gap >= 2:
                    key = (-gap, i, rank[node])
                    if best is None or key < best[0]:
                        best = (key, i, node)
        if best is None:
            return
        _, i, node = best
        leaders[shards[i][0]] -= 1
        leaders[node] += 1
        shards[i].remove(node)
        shards[i].insert(0, node)
