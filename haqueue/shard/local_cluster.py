"""`haqueue cluster up --shards K`: a sharded cluster on one machine, each shard's processes under a Supervisor
of their own (design/sharding.md)."""
from __future__ import annotations

import os
import secrets
from typing import Any

from ..coord.supervisor import HA_USER, Member, Supervisor, print_members, supervise, write_private_yaml
from ..coord.up_config import NO_FILE
from .cluster_config import cluster_from, process_config


def sharded_cluster_up(size: int, shards: int, replicas: int, directory: str, client_port: int, base_port: int,
                       extra: dict[str, Any] | None = None, console_port: int | None = None,
                       origin: str = NO_FILE) -> int:
    """A sharded cluster (design/sharding.md) of `size` simulated nodes on 127.0.0.1, 127.0.0.2, ... (all
    loopback), node k's client address on `client_port`, shared by its shard processes; shard i's peer
    listeners on base_port + i, its direct address 127.0.0.1:base_port + shards + i, with `console_port` its
    web consoles on console_port + i; one Supervisor per shard over its processes, each a `haqueue broker
    --config cluster.yaml --node N --shard I`. `extra`: the config every process starts from (up_config.py), read
    from `origin`; every process's is checked as it will check it before any starts (ConfigError)."""
    directory = os.path.abspath(directory)
    password = secrets.token_hex(16)
    extra = extra or {}
    nodes = {f"n{k + 1}": f"127.0.0.{k + 1}" for k in range(size)}
    raw = {**extra, "shards": shards, "replicas": replicas, "client_port": client_port, "peer_base": base_port,
           "shard_public": f"127.0.0.1:{base_port + shards}",
           "nodes": {node: {"address": host, "data_dir": os.path.join(directory, node)} for node, host in nodes.items()},
           "ha": {**extra.get("ha", {}), "username": HA_USER, "password": password}}
    if console_port:
        raw["http"] = {**extra.get("http", {}), "port": console_port}
    cluster = cluster_from(raw, origin)
    checked = [process_config(cluster, node, shard) for shard, on in enumerate(cluster.placement.shards) for node in on]
    tls = checked[0].ha.tls if checked[0].ha else None  # ha.tls: the same in every process's config
    path = write_private_yaml(directory, "cluster.yaml", raw)
    supervisors = []
    for shard, on in enumerate(cluster.placement.shards):
        members = [Member(f"{node}.s{shard}", (nodes[node], base_port + shard),
                          ["--config", path, "--node", node, "--shard", str(shard)],
                          os.path.join(directory, node, f"s{shard}.log"),
                          f"http://{nodes[node]}:{console_port + shard}/" if console_port else None) for node in on]
        supervisors.append(Supervisor(members, HA_USER, password, tls))
    for node in nodes:
        os.makedirs(os.path.join(directory, node), exist_ok=True)

    def report() -> None:
        for shard, supervisor in enumerate(supervisors):
            print_members(supervisor)
            print(f"shard {shard} public 127.0.0.1:{base_port + shards + shard}", flush=True)
        print("nodes " + " ".join(f"{host}:{client_port}" for host in nodes.values()), flush=True)
    return supervise(supervisors, report)
