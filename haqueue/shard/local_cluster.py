"""`haqueue cluster up --shards K`: a sharded cluster on one machine, each shard's processes under a Supervisor
of their own (design/sharding.md)."""
from __future__ import annotations

import logging
import os
import secrets
from typing import Any

from ..config import ConfigError, TlsConfig
from ..coord.supervisor import HA_USER, Member, Supervisor, print_members, supervise, write_private_yaml
from .cluster_config import load_cluster

log = logging.getLogger("haqueue.cluster")


def sharded_cluster_up(size: int, shards: int, replicas: int, directory: str, client_port: int, base_port: int,
                       extra: dict[str, Any] | None = None, console_port: int | None = None) -> int:
    """A sharded cluster (design/sharding.md) of `size` simulated nodes on 127.0.0.1, 127.0.0.2, ... (all
    loopback), node k's client address on `client_port`, shared by its shard processes; shard i's peer
    listeners on base_port + i, its direct address 127.0.0.1:base_port + shards + i, with `console_port` its
    web consoles on console_port + i; one Supervisor per shard over its processes, each a `haqueue broker
    --config cluster.yaml --node N --shard I`."""
    directory = os.path.abspath(directory)
    password = secrets.token_hex(16)
    extra = extra or {}
    nodes = {f"n{k + 1}": f"127.0.0.{k + 1}" for k in range(size)}
    cluster = {"shards": shards, "replicas": replicas, "client_port": client_port, "peer_base": base_port,
               "shard_public": f"127.0.0.1:{base_port + shards}",
               "nodes": {node: {"address": host, "data_dir": os.path.join(directory, node)}
                         for node, host in nodes.items()},
               "ha": {"username": HA_USER, "password": password, **extra.get("ha", {})},
               **{key: value for key, value in extra.items() if key != "ha"}}
    if console_port:
        cluster["http"] = {"port": console_port}
    path = write_private_yaml(directory, "cluster.yaml", cluster)
    try:
        placement = load_cluster(path).placement
    except ConfigError as e:
        log.error("%s", e)
        return 2
    tls = extra.get("ha", {}).get("tls")
    supervisors = []
    for shard, on in enumerate(placement.shards):
        members = [Member(f"{node}.s{shard}", (nodes[node], base_port + shard),
                          ["--config", path, "--node", node, "--shard", str(shard)],
                          os.path.join(directory, node, f"s{shard}.log"),
                          f"http://{nodes[node]}:{console_port + shard}/" if console_port else None) for node in on]
        supervisors.append(Supervisor(members, HA_USER, password, TlsConfig(**tls) if tls else None))
    for node in nodes:
        os.makedirs(os.path.join(directory, node), exist_ok=True)

    def report() -> None:
        for shard, supervisor in enumerate(supervisors):
            print_members(supervisor)
            print(f"shard {shard} public 127.0.0.1:{base_port + shards + shard}", flush=True)
        print("nodes " + " ".join(f"{host}:{client_port}" for host in nodes.values()), flush=True)
    return supervise(supervisors, report)
