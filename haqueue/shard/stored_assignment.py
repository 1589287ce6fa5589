"""The cluster's assignment in ZooKeeper (design/sharding.md, step 6): `<path>/assignment` holds the placement as
`haqueue place` prints it (JSON). The first shard process to find none writes it: a create, which fails for every
other process, so exactly one document is stored whoever races (compare-and-set on the node's existence). Every
other process reads it and refuses to start if its cluster file gives another placement: its replicas and peers
would not be the cluster's (a stale or different file, or nodes changed and the new placement not stored).

The document names its format (formats.py, `"format": 1`); 0.1.0 stored none (format 1) and compares only the
shards and nodes, so it reads this one as its own. A document of a newer format is refused, never replaced.

To change the placement on purpose, the admin replaces the stored document with the new cluster file's:
`haqueue place --config NEW.yaml --store --replace` (`store`: refused without `replace` when another is stored,
and a compare-and-set on the version read, so two admins cannot both replace what they saw).
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from typing import Any, Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError

from .. import formats
from ..config import ShardConfig, ZooKeeperConfig
from ..coord.zookeeper import START_TIMEOUT_MIN, ZooKeeperUnusable

log = logging.getLogger("haqueue.shard")

ASSIGNMENT = "assignment"  # the znode's name under the cluster path
FORMAT = 1  # the document's


class AssignmentRefused(Exception):
    """Another assignment is stored and was not to be replaced, or it changed while being replaced."""


def agree(client: KazooClient, path: str, assignment: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The cluster's stored assignment and its znode's version: `assignment` and None if written now (there was
    none), else the one stored; NewerFormat if that one is of a format this build does not read."""
    znode = f"{path}/{ASSIGNMENT}"
    client.ensure_path(path)
    try:
        client.create(znode, _document(assignment))
        log.info("stored the cluster's assignment at %s", znode)
        return assignment, None
    except NodeExistsError:
        data, stat = client.get(znode)
        stored: dict[str, Any] = json.loads(data)
        formats.check_document(znode, stored, FORMAT)
        return stored, stat.version


def _document(assignment: dict[str, Any]) -> bytes:
    return json.dumps({**assignment, formats.MARKER: FORMAT}, sort_keys=True).encode()


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


@contextmanager
def _session(zookeeper: ZooKeeperConfig, path: str) -> Iterator[KazooClient]:
    """A short ZooKeeper session; ZooKeeperUnusable if ZooKeeper cannot be reached or used."""
    hosts = ",".join(f"{h}:{p}" for h, p in zookeeper.hosts)
    client = KazooClient(hosts=hosts, timeout=zookeeper.session_timeout)
    try:
        client.start(timeout=max(START_TIMEOUT_MIN, 2 * zookeeper.session_timeout))
        yield client
    except (KazooTimeoutError, KazooException, ValueError) as e:
        raise ZooKeeperUnusable(f"the cluster's assignment at {path}/{ASSIGNMENT} on {hosts} cannot be used: "
                                f"{type(e).__name__} {e}".strip()) from None
    finally:
        client.stop()
        client.close()


def check_stored_assignment(shard: ShardConfig, zookeeper: ZooKeeperConfig) -> None:
    """Store this cluster file's assignment if ZooKeeper has none, else make sure it is the one stored;
    ZooKeeperUnusable (the broker does not start) if it is not, or ZooKeeper cannot be used."""
    assert shard.zookeeper_path is not None  # set with ha.zookeeper (cluster_config.py)
    with _session(zookeeper, shard.zookeeper_path) as client:
        stored, _ = agree(client, shard.zookeeper_path, shard.assignment)
    different = difference(stored, shard.assignment)
    if different is not None:
        raise ZooKeeperUnusable(f"the cluster file's placement is not the cluster's, stored at "
                                f"{shard.zookeeper_path}/{ASSIGNMENT}: {different} (run every process with the "
                                f"same file, or replace it: haqueue place --config FILE --store --replace)")


def store(shard: ShardConfig, zookeeper: ZooKeeperConfig, replace: bool) -> str:
    """Make this cluster file's assignment the cluster's stored one; what was done, as a sentence. Another one
    stored is replaced only with `replace`, and only if unchanged since read (AssignmentRefused otherwise)."""
    assert shard.zookeeper_path is not None
    znode = f"{shard.zookeeper_path}/{ASSIGNMENT}"
    with _session(zookeeper, shard.zookeeper_path) as client:
        stored, version = agree(client, shard.zookeeper_path, shard.assignment)
        if version is None:
            return f"stored the assignment at {znode}"
        different = difference(stored, shard.assignment)
        if different is None:
            return f"{znode} holds this assignment already"
        if not replace:
            raise AssignmentRefused(f"{znode} holds another assignment: {different}; give --replace to replace it")
        try:
            client.set(znode, _document(shard.assignment), version=version)
        except BadVersionError:
            raise AssignmentRefused(f"{znode} changed while it was being replaced: nothing replaced") from None
    log.info("replaced the assignment at %s (%s)", znode, different)
    return f"replaced the assignment at {znode}, where {different}"
