"""How an assignment is written down: the JSON document `haqueue place` prints and reads back with --from
({"shards": [{"shard": 0, "replicas": ["n1", "n2", "n3"]}, ...], "nodes": [...]}, the preferred primary
first; "nodes" says which nodes it was made for, as one may hold nothing), and the table it prints for
people."""
from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .errors import ShardError
from .placement import Assignment, Placement


def to_json(placement: Placement, with_moves: bool) -> dict[str, Any]:
    document: dict[str, Any] = {"shards": [{"shard": i, "replicas": list(nodes)}
                                           for i, nodes in enumerate(placement.shards)],
                                "nodes": list(placement.nodes)}
    if with_moves:
        document["moves"] = [{"shard": m.shard, "from": m.source, "to": m.target} for m in placement.moves]
        document["leader_changes"] = [{"shard": m.shard, "from": m.source, "to": m.target}
                                      for m in placement.leader_changes]
    return document


def from_json(text: str, origin: str) -> tuple[Assignment, tuple[str, ...]]:
    """An assignment and the nodes it was made for, from its JSON document (without "nodes": those holding
    replicas); a malformed one names `origin`, the place and the problem."""
    try:
        document = json.loads(text)
    except ValueError as e:
        raise ShardError(f"{origin}: not JSON: {e}") from None
    shards = document.get("shards") if isinstance(document, dict) else None
    if not isinstance(shards, list):
        raise ShardError(f'{origin}: expected {{"shards": [{{"shard": 0, "replicas": [...]}}, ...]}}')
    assignment = []
    for i, entry in enumerate(shards):
        where = f"{origin}: shards[{i}]"
        if not isinstance(entry, dict) or entry.get("shard") != i or isinstance(entry.get("shard"), bool):
            raise ShardError(f'{where}: expected {{"shard": {i}, "replicas": [...]}} (shards are numbered '
                             f'0, 1, ... in order)')
        replicas = entry.get("replicas")
        if not isinstance(replicas, list) or not all(isinstance(node, str) and node for node in replicas):
            raise ShardError(f"{where}.replicas: expected a list of node names")
        assignment.append(tuple(replicas))
    nodes = document.get("nodes", [node for replicas in assignment for node in replicas])
    if not isinstance(nodes, list) or not all(isinstance(node, str) and node for node in nodes):
        raise ShardError(f"{origin}: nodes: expected a list of node names")
    return tuple(assignment), tuple(dict.fromkeys(nodes))


def to_table(placement: Placement, with_moves: bool) -> str:
    lines = ["shard  replicas (preferred primary first)"]
    lines += [f"{i:<5}  {' '.join(replicas)}" for i, replicas in enumerate(placement.shards)]
    leads = Counter(replicas[0] for replicas in placement.shards)
    holds = Counter(node for replicas in placement.shards for node in replicas)
    nodes = placement.nodes
    width = max(len("node"), *map(len, nodes))
    lines += ["", f"{'node':<{width}}  primaries  replicas"]
    lines += [f"{node:<{width}}  {leads[node]:>9}  {holds[node]:>8}" for node in nodes]
    if with_moves:
        lines += ["", f"moves: {len(placement.moves)}"]
        lines += [f"  shard {m.shard}: {m.source} -> {m.target}" for m in placement.moves]
        lines += [f"preferred primary changes: {len(placement.leader_changes)}"]
        lines += [f"  shard {m.shard}: {m.source} -> {m.target}" for m in placement.leader_changes]
    return "\n".join(lines)
