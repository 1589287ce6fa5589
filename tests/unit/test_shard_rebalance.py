"""Rebalancing (haqueue/shard/rebalance.py): an assignment moved onto a node list with nodes added or removed.

The lower bound each test compares against: a replica on a removed node must move (one move each), and an
added node, which holds nothing, must receive floor(K·R / n) replicas to hold its share, one move per
replica. So no rebalancing moves fewer than max(replicas on removed nodes, added nodes × floor(K·R / n));
these tests require exactly that many.
"""
from __future__ import annotations

import random
from collections import Counter

import pytest

from haqueue.shard.errors import ShardError
from haqueue.shard.placement import Assignment, Placement, place
from haqueue.shard.rebalance import rebalance
from haqueue.shard.topology import Topology

GRID = [(n, k, r) for n in range(2, 8) for k in range(1, 13) for r in range(1, n)]


def nodes(n: int) -> list[str]:
    return [f"n{i + 1}" for i in range(n)]


def load(assignment: Assignment) -> Counter[str]:
    return Counter(node for replicas in assignment for node in replicas)


def lower_bound(old: Assignment, removed: set[str], added: int, n: int) -> int:
    k, r = len(old), len(old[0])
    return max(sum(load(old)[node] for node in removed), added * (k * r // n))


def check_moves_explain(old: Assignment, new: Placement) -> None:
    """Each shard's new replicas are its old ones with exactly the listed moves applied."""
    for i, (before, after) in enumerate(zip(old, new.shards)):
        moves = [m for m in new.moves if m.shard == i]
        assert set(before) - set(after) == {m.source for m in moves}
        assert set(after) - set(before) == {m.target for m in moves}
        assert len(set(after)) == len(before)


@pytest.mark.parametrize("n, k, r", GRID)
def test_the_same_nodes_move_nothing(n: int, k: int, r: int) -> None:
    old = place(Topology.of(nodes(n)), k, r).shards
    assert rebalance(old, nodes(n), Topology.of(nodes(n))) == Placement(old, tuple(nodes(n)))


@pytest.mark.parametrize("n, k, r", GRID)
def test_adding_a_node_moves_exactly_its_share(n: int, k: int, r: int) -> None:
    old = place(Topology.of(nodes(n)), k, r).shards
    new = rebalance(old, nodes(n), Topology.of(nodes(n + 1)))
    assert len(new.moves) == lower_bound(old, set(), 1, n + 1)
    check_moves_explain(old, new)
    after = load(new.shards)
    assert after[f"n{n + 1}"] == k * r // (n + 1)
    assert all(after[node] <= load(old)[node] for node in nodes(n))  # replicas only leave the old nodes
    assert all(m.target == f"n{n + 1}" for m in new.moves)
    leads = Counter(replicas[0] for replicas in new.shards)
    assert leads[f"n{n + 1}"] >= k // (n + 1)


@pytest.mark.parametrize("n, k, r", [(n, k, r) for n, k, r in GRID if r < n - 1 or n > 2])
def test_removing_a_node_moves_exactly_its_replicas(n: int, k: int, r: int) -> None:
    if r > n - 1:
        pytest.skip("R nodes must remain")
    old = place(Topology.of(nodes(n)), k, r).shards
    removed = f"n{(k * 7) % n + 1}"
    remaining = [node for node in nodes(n) if node != removed]
    new = rebalance(old, nodes(n), Topology.of(remaining))
    assert len(new.moves) == lower_bound(old, {removed}, 0, n - 1)
    assert all(m.source == removed for m in new.moves)
    check_moves_explain(old, new)
    before, after = load(old), load(new.shards)
    # the removed node's replicas go where there is room: no node rises more than one above the fair share
    # (one may have to: removing n1 of 7 nodes, 9 shards, 4 replicas, shard 4's other replicas are on the
    # three emptiest nodes, so it lands on a node already at the fair share)
    fair = -(-k * r // (n - 1))
    assert all(after[node] <= max(before[node], fair + 1) for node in remaining)
    leads = Counter(replicas[0] for replicas in new.shards)
    counts = [leads[node] for node in remaining]
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("n, k, r", [(n, k, r) for n, k, r in GRID if n >= 3])
def test_replacing_a_node_moves_its_replicas_to_the_new_one(n: int, k: int, r: int) -> None:
    old = place(Topology.of(nodes(n)), k, r).shards
    replaced = nodes(n)[1]
    new = rebalance(old, nodes(n), Topology.of([node for node in nodes(n) if node != replaced] + ["spare"]))
    assert len(new.moves) == lower_bound(old, {replaced}, 1, n)
    check_moves_explain(old, new)


def random_racked(seed: int) -> tuple[Topology, Topology, int]:
    """A racked topology, the same with one node added (in a random rack) or removed, and R."""
    rng = random.Random(seed)
    names = nodes(rng.randint(4, 9))
    racks = {name: f"r{rng.randrange(rng.randint(2, 4))}" for name in names}
    if rng.random() < 0.5:
        changed = dict(racks, spare=f"r{rng.randrange(4)}")
    else:
        gone = rng.choice(names)
        changed = {name: rack for name, rack in racks.items() if name != gone}
    return Topology.of(names, racks), Topology.of(list(changed), changed), rng.randint(1, min(3, len(changed)))


@pytest.mark.parametrize("seed", range(200))
def test_rebalancing_keeps_racks_apart_whenever_they_can(seed: int) -> None:
    before, after, r = random_racked(seed)
    old = place(before, 8, r).shards
    new = rebalance(old, before.nodes, after)
    check_moves_explain(old, new)
    for replicas in new.shards:
        assert set(replicas) <= set(after.nodes)
        assert max(Counter(after.rack(node) for node in replicas).values()) <= after.per_rack(r)
    # must move: the replicas of a removed node, and those over what one rack need hold of a shard (a new
    # rack makes room); an added node takes its share only where racks allow
    removed = set(before.nodes) - set(after.nodes)
    must = sum(load(old)[node] for node in removed)
    for replicas in old:
        per_rack = Counter(after.rack(node) for node in replicas if node not in removed)
        must += sum(max(0, count - after.per_rack(r)) for count in per_rack.values())
    added = len(set(after.nodes) - set(before.nodes))
    assert must <= len(new.moves) <= max(must, added * (len(old) * r // len(after.nodes)))
    assert rebalance(old, before.nodes, after) == new  # deterministic


def test_racks_given_later_move_one_replica_per_shared_rack() -> None:
    old = place(Topology.of(["a1", "a2", "b1", "b2"]), 4, 2).shards  # (a1 a2) (a2 b1) (b1 b2) (b2 a1)
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    new = rebalance(old, list(racks), Topology.of(list(racks), racks))
    assert [(m.shard, m.source) for m in new.moves] == [(0, "a2"), (2, "b2")]
    assert all({racks[node] for node in replicas} == {"A", "B"} for replicas in new.shards)


def test_a_removed_preferred_primary_hands_its_shards_to_the_least_leading_replicas() -> None:
    old = (("n1", "n2", "n3"), ("n2", "n3", "n4"), ("n3", "n4", "n1"), ("n4", "n1", "n2"))
    new = rebalance(old, ["n1", "n2", "n3", "n4"], Topology.of(["n1", "n2", "n4"]))
    assert [(m.shard, m.source) for m in new.leader_changes] == [(2, "n3")]
    assert new.shards[2][0] == "n4"  # n4 and n1 each lead one shard; the earlier replica wins the tie
    assert sorted(Counter(replicas[0] for replicas in new.shards).values()) == [1, 1, 2]


@pytest.mark.parametrize("old, message", [
    ((), "the assignment has no shards"),
    ((("n1", "n2"), ("n2",)), "shard 1 has 1 replicas but shard 0 has 2"),
    ((("n1", "n1"),), "shard 0 has node 'n1' twice"),
    ((("n1", "n2", "n3"),), "3 replicas need 3 nodes, but there are only 2"),
    ((("n1", "n9"),), "shard 0 is on 'n9', which is not among the assignment's nodes (n1, n2, n3)"),
])
def test_a_bad_assignment_is_refused_naming_the_problem(old: Assignment, message: str) -> None:
    with pytest.raises(ShardError) as refused:
        rebalance(old, ["n1", "n2", "n3"], Topology.of(["n1", "n2"]))
    assert message in str(refused.value)
