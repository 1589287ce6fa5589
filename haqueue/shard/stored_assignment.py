"""The cluster's assignment in ZooKeeper (design/sharding.md, step 6): `<path>/assignment` holds the placement as
`haqueue place` prints it (JSON). The first shard process to find none writes it: a create, which fails for every
other process, so exactly one document is stored whoever races (compare-and-set on the node's existence). Every
other process reads it and refuses to start if its cluster file gives another placement: its replicas and peers
would not be the cluster's (a stale or different file, or nodes changed without `haqueue place --from`).
"""
from __future__ import annotations

import json
import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError

from ..config import ShardConfig, ZooKeeperConfig
from ..coord.zookeeper import START_TIMEOUT_MIN, ZooKeeperUnusable

log = logging.getLogger("haqueue.shard")

ASSIGNMENT = "assignment"  # the znode's name under the cluster path


def agree(client: KazooClient, path: str, assignment: dict[str, Any]) -> dict[str, Any]:
    """The cluster's stored assignment: `assignment`, written now if there was none, else the one stored."""
    znode = f"{path}/{ASSIGNMENT}"
    client.ensure_path(path)
    try:
        client.create(znode, json.dumps(assignment, sort_keys=True).encode())
        log.info("stored the cluster's assignment at %s", znode)
        return assignment
    except NodeExistsError:
        data, _ = client.get(znode)
        stored: dict[str, Any] = json.loads(data)
        return stored


def difference(stored: dict[str, Any], ours: dict[str, Any]) -> str | None:
    """What differs between the stored assignment and ours, first difference only; None if they agree."""
    if stored.get("shards") != ours["shards"]:
        theirs = {s.get("shard"): s.get("replicas") for s in stored.get("shards", []) if isinstance(s, dict)}
        for entry in ours["shards"]:
            if theirs.get(entry["shard"]) != entry["replicas"]:
                return f"shard {entry['shard']}'s replicas are {theirs.get(entry['shard'])} there, " \
                       f"{entry['replicas']} here"
        return f"{len(theirs)} shards there, {len(ours['shards'])} here"
    if stored.get("nodes") != ours["nodes"]:
        return f"the nodes are {stored.get('nodes')} there, {ours['nodes']} here"
    return None


def check_stored_assignment(shard: ShardConfig, zookeeper: ZooKeeperConfig) -> None:
    """Store this cluster file's assignment if ZooKeeper has none, else make sure it is the one stored;
    ZooKeeperUnusable (the broker does not start) if it is not, or ZooKeeper cannot be used."""
    assert shard.zookeeper_path is not None  # set with ha.zookeeper (cluster_config.py)
    hosts = ",".join(f"{h}:{p}" for h, p in zookeeper.hosts)
    client = KazooClient(hosts=hosts, timeout=zookeeper.session_timeout)
    try:
        client.start(timeout=max(START_TIMEOUT_MIN, 2 * zookeeper.session_timeout))
        stored = agree(client, shard.zookeeper_path, shard.assignment)
    except (KazooTimeoutError, KazooException, ValueError) as e:
        raise ZooKeeperUnusable(f"the cluster's assignment at {shard.zookeeper_path}/{ASSIGNMENT} on {hosts} "
                                f"cannot be read: {type(e).__name__} {e}".strip()) from None
    finally:
        client.stop()
        client.close()
    different = difference(stored, shard.assignment)
    if different is not None:
        raise ZooKeeperUnusable(f"the cluster file's placement is not the cluster's, stored at "
                                f"{shard.zookeeper_path}/{ASSIGNMENT}: {different} (run every process with the "
                                f"same file)")
