"""The nodes shards are placed on, and the failure domains each node is in: its rack and its region.

A node without a rack is a rack of its own (losing it loses only it); nodes without a region are all in
one region. Racks and regions are given for every node or for none, as Kafka's rack-aware assignment
insists: with some nodes unlabelled, "no two replicas in one rack" would mean nothing for them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .errors import ShardError


@dataclass(frozen=True)
class Topology:
    nodes: tuple[str, ...]
    racks: Mapping[str, str] = field(default_factory=dict)  # node -> rack; empty: no racks given
    regions: Mapping[str, str] = field(default_factory=dict)  # node -> region; empty: no regions given

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ShardError("no nodes given")
        seen: set[str] = set()
        for node in self.nodes:
            if not node or node != node.strip():
                raise ShardError(f"bad node name {node!r}: empty or with spaces around it")
            if node in seen:
                raise ShardError(f"node {node!r} is named twice")
            seen.add(node)
        for what, labels in (("rack", self.racks), ("region", self.regions)):
            _check_labels(what, labels, self.nodes)
        regions_of_rack: dict[str, set[str]] = {}
        for node in self.nodes:
            regions_of_rack.setdefault(self.rack(node), set()).add(self.region(node))
        for rack, regions in regions_of_rack.items():
            if len(regions) > 1:
                raise ShardError(f"rack {rack!r} is in more than one region ({', '.join(sorted(regions))}): "
                                 f"a rack is in one region")

    @classmethod
    def of(cls, nodes: Sequence[str], racks: Mapping[str, str] | None = None,
           regions: Mapping[str, str] | None = None) -> "Topology":
        return cls(tuple(nodes), dict(racks or {}), dict(regions or {}))

    def rack(self, node: str) -> str:
        return self.racks.get(node, node)

    def region(self, node: str) -> str:
        return self.regions.get(node, "")

    def rack_count(self) -> int:
        return len({self.rack(node) for node in self.nodes})

    def per_rack(self, replicas: int) -> int:
        """The most replicas of one shard a rack need hold: the least m such that the racks, each taking at
        most m and at most its own nodes, take them all (1 while racks are enough)."""
        sizes = Counter(self.rack(node) for node in self.nodes).values()
        most = 1
        while sum(min(size, most) for size in sizes) < replicas:
            most += 1
        return most

    def rack_shortage(self, replicas: int) -> str | None:
        """Why some shards must keep two replicas in one rack, or None when every shard can have R racks."""
        racks = self.rack_count()
        if not self.racks or racks >= replicas:
            return None
        return (f"only {racks} racks for {replicas} replicas: each shard has replicas sharing a rack "
                f"(at most {self.per_rack(replicas)} in one rack)")

    def placement_order(self) -> list[str]:
        """The nodes in the order shards are laid on: round-robin over the regions, and within each region
        round-robin over its racks (Kafka's rack-alternated broker list, one level up). Walking it, each
        step meets another rack, so rack-aware replicas stay consecutive and spread evenly. Without racks
        or regions it is the nodes' own order."""
        racks_by_region: dict[str, dict[str, list[str]]] = {}
        for node in self.nodes:
            racks_by_region.setdefault(self.region(node), {}).setdefault(self.rack(node), []).append(node)
        return _round_robin([_round_robin(list(racks.values())) for racks in racks_by_region.values()])


def _check_labels(what: str, labels: Mapping[str, str], nodes: tuple[str, ...]) -> None:
    unknown = [node for node in labels if node not in nodes]
    if unknown:
        raise ShardError(f"{what} given for unknown node {unknown[0]!r} (the nodes are {', '.join(nodes)})")
    for node, label in labels.items():
        if not label:
            raise ShardError(f"empty {what} for node {node!r}")
    missing = [node for node in nodes if node not in labels]
    if labels and missing:
        raise ShardError(f"no {what} for {', '.join(missing)}: give every node a {what}, or none")


def _round_robin(groups: list[list[str]]) -> list[str]:
    """The first of each group, then the second of each, ... (a group that runs out is skipped)."""
    return [group[i] for i in range(max(map(len, groups), default=0)) for group in groups if i < len(group)]
