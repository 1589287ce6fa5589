"""shard/stored_assignment.py: what differs between the assignment ZooKeeper holds and a cluster file's."""
from __future__ import annotations

import pytest

pytest.importorskip("kazoo")

from haqueue.shard.stored_assignment import difference  # noqa: E402

OURS = {"shards": [{"shard": 0, "replicas": ["n1", "n2"]}, {"shard": 1, "replicas": ["n2", "n3"]}],
        "nodes": ["n1", "n2", "n3"]}


@pytest.mark.parametrize("stored, found", [
    (OURS, None),
    ({**OURS, "shards": [OURS["shards"][0], {"shard": 1, "replicas": ["n3", "n2"]}]},
     "shard 1's replicas are ['n3', 'n2'] there, ['n2', 'n3'] here"),
    ({**OURS, "shards": OURS["shards"] + [{"shard": 2, "replicas": ["n3", "n1"]}]}, "3 shards there, 2 here"),
    ({**OURS, "nodes": ["n1", "n2", "n3", "n4"]}, "the nodes are ['n1', 'n2', 'n3', 'n4'] there, ['n1', 'n2', 'n3'] "
                                                  "here"),
])
def test_the_first_difference_is_named(stored: dict, found: str | None) -> None:
    assert difference(stored, OURS) == found
