"""Placement (haqueue/shard/placement.py): shard i on nodes (i + j) mod n, the preferred primary first, no
two replicas of a shard in one rack while racks are enough, regions spread, primaries spread evenly.

Property-style: every (nodes, shards, replicas) of a grid, and seeded random rack layouts.
"""
from __future__ import annotations

import random
from collections import Counter

import pytest

from haqueue.shard.errors import ShardError
from haqueue.shard.placement import Assignment, place
from haqueue.shard.topology import Topology

GRID = [(n, k, r) for n in range(1, 8) for k in range(1, 15) for r in range(1, n + 1)]


def nodes(n: int) -> list[str]:
    return [f"n{i + 1}" for i in range(n)]


def random_racks(seed: int) -> Topology:
    """4-9 nodes on 1-5 racks of uneven sizes, the racks in 1-3 regions, names shuffled."""
    rng = random.Random(seed)
    names = nodes(rng.randint(4, 9))
    rng.shuffle(names)
    rack_count = rng.randint(1, 5)
    racks = {name: f"r{rng.randrange(rack_count)}" for name in names}
    region_of_rack = {rack: f"g{rng.randrange(3)}" for rack in set(racks.values())}
    return Topology.of(names, racks, {name: region_of_rack[rack] for name, rack in racks.items()})


def fewest_per_rack(topology: Topology, replicas: int) -> int:
    """The least m such that racks holding at most m replicas each (and at most their nodes) hold them all:
    no placement can put fewer replicas of a shard in its fullest rack."""
    sizes = Counter(topology.rack(node) for node in topology.nodes).values()
    return next(m for m in range(1, replicas + 1) if sum(min(size, m) for size in sizes) >= replicas)


def leader_counts(assignment: Assignment, names: tuple[str, ...]) -> list[int]:
    leads = Counter(replicas[0] for replicas in assignment)
    return [leads[name] for name in names]


@pytest.mark.parametrize("n, k, r", GRID)
def test_without_racks_shard_i_is_on_nodes_i_plus_j_mod_n(n: int, k: int, r: int) -> None:
    names = nodes(n)
    placement = place(Topology.of(names), k, r)
    assert placement.shards == tuple(tuple(names[(i + j) % n] for j in range(r)) for i in range(k))
    assert placement.warnings == ()


@pytest.mark.parametrize("n, k, r", GRID)
def test_preferred_primaries_differ_by_at_most_one_shard_per_node(n: int, k: int, r: int) -> None:
    counts = leader_counts(place(Topology.of(nodes(n)), k, r).shards, tuple(nodes(n)))
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("seed", range(300))
def test_racks_hold_one_replica_of_a_shard_whenever_they_can(seed: int) -> None:
    topology = random_racks(seed)
    racks, regions = topology.rack_count(), len(set(topology.regions.values()))
    for r in range(1, len(topology.nodes) + 1):
        for k in (1, 5, 12):
            placement = place(topology, k, r)
            for replicas in placement.shards:
                assert len(set(replicas)) == r
                per_rack = Counter(topology.rack(node) for node in replicas)
                assert max(per_rack.values()) == fewest_per_rack(topology, r)  # 1 while racks are enough
                assert len({topology.region(node) for node in replicas}) == min(r, regions)
            # with racks, primaries still on as many nodes as there are shards, evenly
            counts = leader_counts(placement.shards, topology.nodes)
            assert max(counts) - min(counts) <= 1
            assert sum(1 for c in counts if c) == min(k, len(topology.nodes))
            assert bool(placement.warnings) == (r > racks)


def test_racks_of_equal_size_keep_replicas_consecutive_in_the_rack_alternated_order() -> None:
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C", "c2": "C"}
    placement = place(Topology.of(list(racks), racks), 6, 3)
    assert placement.shards == (("a1", "b1", "c1"), ("b1", "c1", "a2"), ("c1", "a2", "b2"),
                                ("a2", "b2", "c2"), ("b2", "c2", "a1"), ("c2", "a1", "b1"))
    assert Counter(node for replicas in placement.shards for node in replicas) == {node: 3 for node in racks}


def test_too_few_racks_spreads_over_regions_and_says_so() -> None:
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    regions = {"a1": "eu", "a2": "eu", "b1": "us", "b2": "us"}
    placement = place(Topology.of(list(racks), racks, regions), 4, 3)
    for replicas in placement.shards:
        assert {regions[node] for node in replicas} == {"eu", "us"}
    assert placement.warnings == ("only 2 racks for 3 replicas: each shard has replicas sharing a rack "
                                  "(at most 2 in one rack)",)


def test_regions_without_racks_put_each_replica_in_another_region_first() -> None:
    regions = {"e1": "eu", "e2": "eu", "e3": "eu", "u1": "us"}
    placement = place(Topology.of(list(regions), regions=regions), 4, 2)
    assert all({regions[node] for node in replicas} == {"eu", "us"} for replicas in placement.shards)
    assert placement.warnings == ()


@pytest.mark.parametrize("seed", range(20))
def test_the_same_input_gives_the_same_placement(seed: int) -> None:
    topology = random_racks(seed)
    r = min(3, len(topology.nodes))
    assert place(topology, 7, r) == place(random_racks(seed), 7, r)


@pytest.mark.parametrize("names, racks, regions, k, r, message", [
    (["n1", "n2"], {}, {}, 3, 3, "3 replicas need 3 nodes, but there are only 2 (n1, n2)"),
    (["n1", "n2"], {}, {}, 0, 1, "shards must be at least 1, got 0"),
    (["n1", "n2"], {}, {}, 1, 0, "replicas must be at least 1, got 0"),
    ([], {}, {}, 1, 1, "no nodes given"),
    (["n1", "n1"], {}, {}, 1, 1, "node 'n1' is named twice"),
    (["n1", ""], {}, {}, 1, 1, "bad node name ''"),
    (["n1", "n2"], {"n9": "A"}, {}, 1, 1, "rack given for unknown node 'n9' (the nodes are n1, n2)"),
    (["n1", "n2", "n3"], {"n1": "A"}, {}, 1, 1, "no rack for n2, n3: give every node a rack, or none"),
    (["n1", "n2"], {}, {"n1": "eu"}, 1, 1, "no region for n2: give every node a region, or none"),
    (["n1", "n2"], {"n1": "A", "n2": "A"}, {"n1": "eu", "n2": "us"}, 1, 1,
     "rack 'A' is in more than one region (eu, us)"),
])
def test_bad_input_is_refused_naming_the_problem(names: list[str], racks: dict[str, str], regions: dict[str, str],
                                                 k: int, r: int, message: str) -> None:
    with pytest.raises(ShardError) as refused:
        place(Topology.of(names, racks, regions), k, r)
    assert message in str(refused.value)
