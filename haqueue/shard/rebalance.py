"""A new assignment when nodes are added or removed, moving as few replicas as possible.

What must move: every replica on a node that is gone, and a replica sharing a rack that need not be
shared (racks given since). Each is one move. What an added node (it holds nothing) must take to do its
share: floor(K·R / n) replicas, each one move. So no rebalancing moves fewer than max(must move, added
nodes × floor(K·R / n)) replicas, and this one moves that many: the displaced replicas go to the added
nodes first, and only what they still lack is taken from the fullest nodes. Everything else stays where
it is, so rebalancing an assignment onto its own nodes moves nothing. Which nodes are added is known from
the nodes the old assignment was made for (one of those may hold nothing when K·R < n). Preferred
primaries are then evened out among each shard's replicas, which moves no data (each change is a
preferred-primary failover once applied).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .errors import ShardError
from .placement import Move, Placement, check_counts, domain_cost
from .topology import Topology


def rebalance(old: Sequence[Sequence[str]], old_nodes: Sequence[str], topology: Topology) -> Placement:
    """`old`, made for `old_nodes`, onto `topology`'s nodes: those not in old_nodes are added ones."""
    replicas = replica_count(old)
    check_counts(topology, len(old), replicas)
    for i, nodes in enumerate(old):
        stray = next((node for node in nodes if node not in old_nodes), None)
        if stray is not None:
            raise ShardError(f"shard {i} is on {stray!r}, which is not among the assignment's nodes "
                             f"({', '.join(old_nodes)})")
    shards, displaced = _keep(old, topology, replicas)
    order = topology.placement_order()
    rank = {node: i for i, node in enumerate(order)}
    load = Counter({node: 0 for node in order})
    load.update(node for nodes in shards for node in nodes)
    added = {node for node in order if node not in old_nodes}
    floor = len(old) * replicas // len(order)
    moves: list[Move] = []
    # What must move goes to added nodes below their share first, else where it is safest and emptiest.
    for shard, source in displaced:  # not counted in load: its node is gone or its rack is full
        nodes = shards[shard]
        target = min((node for node in order if node not in nodes),
                     key=lambda node: (domain_cost(topology, nodes, node),
                                       not (node in added and load[node] < floor), load[node], rank[node]))
        nodes.append(target)
        load[target] += 1
        if target != source:  # a rack-full replica with nowhere safer to go stays
            moves.append(Move(shard, source, target))
    _spread(shards, moves, topology, load, rank)
    _lead(old, shards)
    # Added nodes still below their share take replicas from the fullest nodes (never one just moved).
    placed = {(move.shard, move.target) for move in moves}
    leaders = Counter(nodes[0] for nodes in shards)
    least_leaders = len(old) // len(order)
    for node in (n for n in order if n in added):
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
            load[node] += 1
            moves.append(Move(shard, source, node))
    _even_leaders(shards, leaders, rank)
    changes = tuple(Move(i, old[i][0], nodes[0]) for i, nodes in enumerate(shards) if nodes[0] != old[i][0])
    shortage = topology.rack_shortage(replicas)
    return Placement(tuple(tuple(nodes) for nodes in shards), topology.nodes, tuple(moves), changes,
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
    gone, or over the most replicas of a shard one rack need hold (1 when racks are enough)."""
    per_rack = topology.per_rack(replicas)
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


def _spread(shards: list[list[str]], moves: list[Move], topology: Topology, load: Counter[str],
            rank: dict[str, int]) -> None:
    """Re-aim the moves so no target holds two more replicas than a node that could take one as safely:
    placing one replica at a time, an early choice may leave a later one only a full node. Still one move
    each. A shard with several moves keeps them where they are (re-aiming one would change what is safe
    for the other)."""
    per_shard = Counter(move.shard for move in moves)
    allowed = []
    for move in moves:
        nodes = shards[move.shard]
        others = [node for node in nodes if node != move.target]
        cost = domain_cost(topology, others, move.target)
        allowed.append([move.target] if per_shard[move.shard] > 1 else
                       [node for node in rank if node not in others and domain_cost(topology, others, node) <= cost])
    chosen = [move.target for move in moves]
    _balance(allowed, chosen, load, rank)
    for index, (move, target) in enumerate(zip(moves, chosen)):
        nodes = shards[move.shard]
        nodes[nodes.index(move.target)] = target
        moves[index] = Move(move.shard, move.source, target)


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
    """The replica an added node should take next: from the fullest node above its share, where the move
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
    """Hand preferred primaries among each shard's replicas until leaders are as even as the replicas
    allow. No data moves; an assignment already within one changes nothing."""
    chosen = [nodes[0] for nodes in shards]
    _balance([list(nodes) for nodes in shards], chosen, leaders, rank)
    for nodes, leader in zip(shards, chosen):
        nodes.remove(leader)
        nodes.insert(0, leader)


def _balance(allowed: list[list[str]], chosen: list[str], load: Counter[str], rank: dict[str, int]) -> None:
    """Item i is on node chosen[i] and may be on any of allowed[i]. While some node carries at least two
    more items than one it can reach through the items, shift items along the shortest such path (A's item
    to C, C's to B: A carries one fewer, B one more, C as many). Each shift evens the load, so this ends;
    then the most loaded node can shed nothing. Searched in a fixed order: deterministic."""
    while True:
        path = _shortest_shift(allowed, chosen, load, rank)
        if path is None:
            return
        for item, node in path:
            load[chosen[item]] -= 1
            load[node] += 1
            chosen[item] = node


def _shortest_shift(allowed: list[list[str]], chosen: list[str], load: Counter[str],
                    rank: dict[str, int]) -> list[tuple[int, str]] | None:
    carried: dict[str, list[int]] = {}
    for item, node in enumerate(chosen):
        carried.setdefault(node, []).append(item)
    for start in sorted(carried, key=lambda node: (-load[node], rank[node])):
        paths: dict[str, list[tuple[int, str]]] = {start: []}
        frontier = [start]
        while frontier:
            reached: list[str] = []
            for node in frontier:
                for item in carried.get(node, []):
                    for other in sorted(allowed[item], key=rank.__getitem__):
                        if other in paths:
                            continue
                        paths[other] = paths[node] + [(item, other)]
                        if load[other] <= load[start] - 2:
                            return paths[other]
                        reached.append(other)
            frontier = reached
    return None
