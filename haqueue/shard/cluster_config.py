"""A sharded cluster's one config file, and the ordinary BrokerConfig of each (node, shard) process.

The file is a broker config (users, limits, store, ha credentials...) plus the cluster's keys:

    shards: 6                      # K
    replicas: 3                    # R, each on its own node
    nodes: {n1: {address: 10.0.0.1, rack: r1, region: eu, data_dir: /var/lib/haqueue}, ...}
    client_port: 5672              # every node's client address: its address, this port (SO_REUSEPORT)
    peer_base: 5700                # shard i's peer listener: the node's address, port peer_base + i
    shard_public: 10.0.1.1:5800    # shard i's direct address, port + i, bound only by its primary
    http: {port: 8672}             # optional: shard i's web console on its node's address, port + i (tls and
                                   # allow_origins as a broker's http section; its listen is derived)
    shard:
      redirect: false              # true: a link to another shard's queue is refused with amqp:link:redirect
                                   # naming the owner's direct address, instead of being relayed
      relay_timeout: 60            # seconds the relay (and the wiring broadcast) looks for a shard's primary
                                   # before giving up: longer than a failover, Pacemaker's included
    pacemaker:                     # instead of shard_public, when Pacemaker runs the processes (pcs-shard-setup.sh):
      node_vips: {n1: 10.0.0.101, ...}   # each node's client address, a VIP that moves while its node is down
      shard_vips: [10.0.1.10, ...]       # shard i's direct address: its VIP, on its primary's node, port shard_port + i
      shard_port: 5800

The placement is computed (shard/placement.py), never listed. What the placement derives per process
(`name`, `listen`, `http.listen`, `ha.brokers`, `ha.public`, `ha.zookeeper.preferred`) may not be given (design/sharding.md,
step 2). Under ZooKeeper each shard elects on its own path, `ha.zookeeper.path`/shards/<i>. Under Pacemaker the VIPs
come and go with the processes' roles, so a process binds wildcard addresses (the node's client port, its shard's
direct port) and has no `ha.public`: Pacemaker's VIP is the public address, as for an unsharded cluster.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..config import CLUSTER_KEY, PREFERRED_SYNC_MODES, BrokerConfig, Check, ConfigError, QueueConfig, \
    ShardConfig, ZooKeeperConfig, _address, _Bad, _bool, _fields, _int, _list_of, _map_of, _name, _positive_seconds, \
    broker_config, read_yaml
from .assignment import to_json
from .errors import ShardError
from .forwarding_queues import forwarding_args
from .ownership import owning_shard, shard_of_name
from .placement import Placement, place
from .topology import Topology

DEFAULT_CLIENT_PORT = 5672
DEFAULT_PEER_BASE = 5700
DEFAULT_SHARD_PORT = 5800
ANY_ADDRESS = "0.0.0.0"  # under Pacemaker: whichever VIP is on the node reaches its processes
_NODE: dict[str, Check] = {"address": _name, "rack": _name, "region": _name, "data_dir": _name}
_OPTIONS: dict[str, Check] = {"redirect": _bool, "relay_timeout": _positive_seconds}  # the file's `shard:` section
_PACEMAKER: dict[str, Check] = {"node_vips": _map_of(_name), "shard_vips": _list_of(_name), "shard_port": _int(1)}
_CLUSTER: dict[str, Check] = {CLUSTER_KEY: _int(1), "replicas": _int(1), "nodes": lambda value, path: value,
            "client_port": _int(1), "peer_base": _int(1), "shard_public": _address,
            "shard": lambda value, path: _fields(value, path, _OPTIONS),
            "pacemaker": lambda value, path: _fields(value, path, _PACEMAKER, ("node_vips", "shard_vips"))}
_DERIVED = {"name": "the process's name is <node>.s<shard>",
            "listen": "each process listens on its node's client address and its shard's peer port",
            "metrics": "one metrics endpoint per process is not built yet"}
_DERIVED_HA = {"brokers": "the shard's replicas come from the placement",
               "public": "each shard's direct address is shard_public's port + its index, or its VIP (pacemaker)"}


@dataclass(frozen=True)
class Node:
    address: str
    data_dir: str | None


@dataclass(frozen=True)
class Pacemaker:
    node_vips: dict[str, str]  # node -> its client address's VIP
    shard_vips: list[str]  # shard i's direct address's VIP, colocated with its promoted instance


@dataclass(frozen=True)
class Cluster:
    origin: str  # the file
    shards: int
    replicas: int
    nodes: dict[str, Node]
    client_port: int
    peer_base: int
    publics: list[tuple[str, int]]  # each shard's direct address (shard_public's port + i, or its VIP)
    placement: Placement
    redirect: bool  # shard.redirect: links to other shards are redirected, not relayed
    relay_timeout: float  # shard.relay_timeout
    pacemaker: Pacemaker | None  # None: each shard's primary binds its direct address itself (ha.public)
    broker: dict[str, Any]  # the rest: every process's broker config, before what is derived


def load_cluster(path: str) -> Cluster:
    return cluster_from(read_yaml(path), path)


def cluster_from(raw: Any, origin: str) -> Cluster:
    """Check a cluster config read from `origin` (a file, or what `cluster up --shards` makes of one)."""
    try:
        return _cluster(raw, origin)
    except _Bad as e:
        raise ConfigError(f"{origin}: {e.path}: {e.reason}") from e


def shard_process_config(path: str, node: str, shard: int) -> BrokerConfig:
    """The config of shard `shard`'s replica on `node`, from the cluster file at `path`."""
    return process_config(load_cluster(path), node, shard)


def process_config(cluster: Cluster, node: str, shard: int) -> BrokerConfig:
    origin = cluster.origin
    if node not in cluster.nodes:
        raise ConfigError(f"{origin}: nodes: no node {node!r} (the nodes are {', '.join(cluster.nodes)})")
    if not 0 <= shard < cluster.shards:
        raise ConfigError(f"{origin}: {CLUSTER_KEY}: no shard {shard}: the shards are 0 to {cluster.shards - 1}")
    replicas = cluster.placement.shards[shard]
    if node not in replicas:
        raise ConfigError(f"{origin}: nodes: shard {shard} has no replica on {node} (its replicas are on "
                          f"{', '.join(replicas)})")
    here = cluster.nodes[node]
    client = (ANY_ADDRESS if cluster.pacemaker else here.address, cluster.client_port)
    raw = dict(cluster.broker)
    raw["name"] = process_name(node, shard)
    raw["data_dir"] = f"{here.data_dir or raw.get('data_dir', './data')}/shard-{shard}"
    raw["listen"] = [{"address": host_port(*client), "reuse_port": True},
                     host_port(here.address, cluster.peer_base + shard)]
    raw["ha"] = {**raw["ha"], "brokers": [host_port(cluster.nodes[r].address, cluster.peer_base + shard)
                                          for r in replicas]}
    if "http" in raw:  # its console: a port per process, as its peer listener
        http = dict(raw["http"])
        port = http.pop("port")
        raw["http"] = {**http, "listen": host_port(here.address, port + shard)}
    if cluster.pacemaker:  # the shard's VIP reaches this process's direct listener while it is primary
        raw["listen"].append(host_port(ANY_ADDRESS, cluster.publics[shard][1]))
    else:  # the primary binds its shard's direct address itself
        raw["ha"]["public"] = host_port(*cluster.publics[shard])
    config = broker_config(raw, origin)
    config.shard = ShardConfig(shard, cluster.shards, cluster.publics, client,
                               [[(r, (cluster.nodes[r].address, cluster.peer_base + i)) for r in on]
                                for i, on in enumerate(cluster.placement.shards)], cluster.redirect,
                               to_json(cluster.placement, with_moves=False), relay_timeout=cluster.relay_timeout)
    _queues_of_shard(config, shard, cluster.shards, origin)
    if config.ha is not None and config.ha.zookeeper is not None:
        config.shard.zookeeper_path = config.ha.zookeeper.path
        config.ha.zookeeper = _shard_election(config.ha.zookeeper, config.ha.sync, shard, node == replicas[0])
    return config


def _shard_election(zookeeper: ZooKeeperConfig, sync: str, shard: int, preferred: bool) -> ZooKeeperConfig:
    """A shard is an HA group of its own under ZooKeeper: its election, epoch and members under
    `<path>/shards/<i>`, and the placement's first replica its preferred primary, re-elected when it returns
    (design/sharding.md, step 6), where the sync mode lets it be ranked first (every ready backup holds
    every confirmed message)."""
    return replace(zookeeper, path=f"{zookeeper.path}/shards/{shard}",
                   preferred=preferred and sync in PREFERRED_SYNC_MODES)


def _queues_of_shard(config: BrokerConfig, shard: int, shards: int, origin: str) -> None:
    """The file's queues as this shard holds them: its own as they are, every other shard's as a forwarding queue
    (as wiring_broadcast.py declares a queue at run time), and one for each other shard's queue that only a
    binding names (this shard's own are left to auto-create, as in any broker)."""
    listed = {q.name for q in config.queues}
    for binding in config.bindings:
        if binding.queue not in listed and shard_of_name(binding.queue, shards) != shard:
            listed.add(binding.queue)
            config.queues.append(QueueConfig(binding.queue))
    for i, queue in enumerate(config.queues):
        try:
            owner = owning_shard(queue.name, queue.args, shards)
        except ShardError as e:
            raise ConfigError(f"{origin}: queues[{i}]: {e}") from None
        if owner != shard:
            queue.args = forwarding_args(owner, queue.args)


def process_name(node: str, shard: int) -> str:
    """The broker name of shard `shard`'s replica on `node`."""
    return f"{node}.s{shard}"


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cluster(raw: Any, origin: str) -> Cluster:
    if not isinstance(raw, dict):
        raise _Bad("top level", "must be a map")
    own = _fields({key: raw[key] for key in _CLUSTER if key in raw}, "", _CLUSTER, (CLUSTER_KEY, "replicas", "nodes"))
    broker = {key: value for key, value in raw.items() if key not in _CLUSTER}
    for key, why in _DERIVED.items():
        if key in broker:
            raise _Bad(key, f"not in a cluster's config: {why}")
    if not isinstance(broker.get("ha"), dict):
        raise _Bad("ha", "missing: each shard is an HA group (give at least username and password)")
    for key, why in _DERIVED_HA.items():
        if key in broker["ha"]:
            raise _Bad(f"ha.{key}", f"not in a cluster's config: {why}")
    if isinstance(broker["ha"].get("zookeeper"), dict) and "preferred" in broker["ha"]["zookeeper"]:
        raise _Bad("ha.zookeeper.preferred", "not in a cluster's config: each shard's preferred primary is the first "
                                             "of its replicas in the placement")
    nodes, racks, regions = _nodes(own["nodes"])
    shards, replicas = own[CLUSTER_KEY], own["replicas"]
    if "http" in broker:
        _console_ports(broker["http"], shards)
    try:
        placement = place(Topology.of(list(nodes), racks, regions), shards, replicas)
    except ShardError as e:  # haqueue place's own checks: unknown node, R > n, racks for some nodes only...
        raise _Bad("nodes", str(e)) from None
    client_port = own.get("client_port", DEFAULT_CLIENT_PORT)
    peer_base = own.get("peer_base", DEFAULT_PEER_BASE)
    if peer_base + shards - 1 > 65535:
        raise _Bad("peer_base", f"leaves no room for {shards} shards' ports (peer_base + shard <= 65535)")
    if peer_base <= client_port < peer_base + shards:
        raise _Bad("client_port", f"is among the shards' peer ports {peer_base}..{peer_base + shards - 1}")
    pacemaker = _pacemaker(own["pacemaker"], nodes, shards) if "pacemaker" in own else None
    if pacemaker and broker["ha"].get("coordinator") == "zookeeper":
        raise _Bad("pacemaker", "not with ha.coordinator: zookeeper (Pacemaker decides the roles)")
    if pacemaker and "shard_public" in own:
        raise _Bad("shard_public", "not with pacemaker: each shard's direct address is its VIP (pacemaker.shard_vips)")
    if pacemaker:
        port = own["pacemaker"].get("shard_port", DEFAULT_SHARD_PORT)
        key, publics = "pacemaker.shard_port", [(vip, port + i) for i, vip in enumerate(pacemaker.shard_vips)]
    elif "shard_public" in own:
        (host, port), key = own["shard_public"], "shard_public"
        publics = [(host, port + i) for i in range(shards)]
    else:
        raise _Bad("shard_public", "missing (or a pacemaker: section): each shard's direct address")
    if port + shards - 1 > 65535:
        raise _Bad(key, f"leaves no room for {shards} shards' ports (its port + shard <= 65535)")
    options = own.get("shard", {})
    return Cluster(origin, shards, replicas, nodes, client_port, peer_base, publics, placement,
                   options.get("redirect", False), options.get("relay_timeout", ShardConfig.relay_timeout), pacemaker,
                   broker)


def _console_ports(http: Any, shards: int) -> None:
    """A cluster's `http:` gives the first console port: shard i's processes serve theirs on port + i."""
    if not isinstance(http, dict):
        raise _Bad("http", "must be a map: {port: PORT} (shard i's console on its node's address, port + i), "
                           "and optionally tls and allow_origins")
    if "listen" in http:
        raise _Bad("http.listen", "not in a cluster's config: shard i's process serves its console on its node's "
                                  "address, port http.port + i")
    if "port" not in http:
        raise _Bad("http.port", "missing: shard i's process serves its console on its node's address, port + i")
    if _int(1)(http["port"], "http.port") + shards - 1 > 65535:
        raise _Bad("http.port", f"leaves no room for {shards} shards' ports (its port + shard <= 65535)")


def _pacemaker(fields: dict[str, Any], nodes: dict[str, Node], shards: int) -> Pacemaker:
    node_vips, shard_vips = fields["node_vips"], fields["shard_vips"]
    if sorted(node_vips) != sorted(nodes):
        raise _Bad("pacemaker.node_vips", f"must give a VIP for each node ({', '.join(nodes)}), got "
                                          f"{', '.join(node_vips) or 'none'}")
    if len(shard_vips) != shards:
        raise _Bad("pacemaker.shard_vips", f"must give a VIP for each of the {shards} shards, got {len(shard_vips)}")
    return Pacemaker(node_vips, shard_vips)


def _nodes(value: Any) -> tuple[dict[str, Node], dict[str, str], dict[str, str]]:
    if not isinstance(value, dict) or not value:
        raise _Bad("nodes", "must be a map of node names to {address, rack, region, data_dir}")
    nodes: dict[str, Node] = {}
    racks: dict[str, str] = {}
    regions: dict[str, str] = {}
    for name, entry in value.items():
        path = f"nodes.{name}"
        if not isinstance(name, str) or not name or name != name.strip():
            raise _Bad("nodes", f"node names must be non-empty strings without spaces around, got {name!r}")
        fields = _fields(entry, path, _NODE, ("address",))
        nodes[name] = Node(fields["address"], fields.get("data_dir"))
        if "rack" in fields:
            racks[name] = fields["rack"]
        if "region" in fields:
            regions[name] = fields["region"]
    return nodes, racks, regions
