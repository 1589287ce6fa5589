"""`haqueue admin cluster status`: a sharded cluster seen from any one of its processes (design/sharding.md, step 7).

The process asked answers `READ cluster` with the layout it was derived with: each shard's direct address and
its replicas in placement order (the preferred primary first), with their names and peer addresses. The command
then reads `ha status` from every process at its peer address and puts the answers together: per shard its
primary, preferred primary, backups with state and lag, and epoch; per node the processes it hosts and their
roles. A process that does not answer is shown unreachable, with why; a shard none of whose processes is primary
is shown with no primary (between a primary's death and its successor's promotion): neither is an error.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..admin_stat import table
from ..config import ShardConfig
from .cluster_config import host_port, process_name

if TYPE_CHECKING:
    from ..broker.server import Broker

# A process's peer address -> its `ha status`; raises (AdminError) if it cannot be had.
ReadHa = Callable[[str], dict[str, Any]]
UNREACHABLE = "unreachable"


def serve_layout(broker: "Broker", config: ShardConfig) -> None:
    """Answer `READ cluster` (admin only, as `READ ha`) with this process's view of the cluster's layout."""
    layout = {"shards": [{"shard": i, "public": host_port(*config.publics[i]),
                          "replicas": [{"name": process_name(node, i), "node": node, "address": host_port(*peer)}
                                       for node, peer in replicas]}
                         for i, replicas in enumerate(config.replicas)]}
    broker.management.register("cluster", "READ", lambda name, body: (200, layout))


def read_all(layout: dict[str, Any], read: ReadHa) -> dict[str, dict[str, Any] | str]:
    """Every process's `ha status` by name, or why it could not be read."""
    answers: dict[str, dict[str, Any] | str] = {}
    for shard in layout["shards"]:
        for replica in shard["replicas"]:
            try:
                answers[replica["name"]] = read(replica["address"])
            except Exception as e:  # noqa: BLE001 - whatever kept it from answering is what the report shows
                answers[replica["name"]] = str(e) or type(e).__name__
    return answers


def cluster_status(layout: dict[str, Any], answers: dict[str, dict[str, Any] | str]) -> dict[str, Any]:
    """The report: {"shards": [...], "nodes": [...]} from the layout and every process's answer."""
    shards = [_shard(shard, answers) for shard in layout["shards"]]
    nodes: dict[str, list[dict[str, Any]]] = {}
    for shard in layout["shards"]:
        for replica in shard["replicas"]:
            answer = answers[replica["name"]]
            process: dict[str, Any] = {"name": replica["name"], "shard": shard["shard"]}
            process.update({"role": answer["role"], "state": answer["state"]} if isinstance(answer, dict)
                           else {"role": None, "state": UNREACHABLE, "error": answer})
            nodes.setdefault(replica["node"], []).append(process)
    return {"shards": shards,
            "nodes": [{"node": node, "processes": sorted(processes, key=lambda p: p["shard"])}
                      for node, processes in nodes.items()]}


def _shard(shard: dict[str, Any], answers: dict[str, dict[str, Any] | str]) -> dict[str, Any]:
    replicas = shard["replicas"]
    read: dict[str, dict[str, Any]] = {}
    for replica in replicas:
        answer = answers[replica["name"]]
        if isinstance(answer, dict):
            read[replica["name"]] = answer
    claims = [name for name, answer in read.items() if answer["role"] == "primary"]
    # Two claim the role only for a moment (a deposed primary not yet fenced): the higher epoch is the primary.
    primary = max(claims, key=lambda name: read[name]["epoch"], default=None)
    epochs = [answer["epoch"] for answer in read.values()]
    seen_by_primary = {b["name"]: b for b in read[primary]["backups"]} if primary is not None else {}
    backups = []
    for replica in replicas:
        name = replica["name"]
        if name == primary:
            continue
        backup: dict[str, Any] = {"name": name, "node": replica["node"]}
        if name in seen_by_primary:  # the primary's view: the state that decides confirms, and the lag
            seen = seen_by_primary[name]
            backup.update(state=seen["state"], lag=seen["lag"], lag_seconds=seen["lag_seconds"])
        elif name in read:  # not (yet) attached to the primary: what it says of itself
            own = read[name]
            backup.update(state=own["state"] if own["role"] != "primary" else "primary (deposed)",
                          lag=None, lag_seconds=None)
        else:
            backup.update(state=UNREACHABLE, lag=None, lag_seconds=None, error=answers[name])
        backups.append(backup)
    return {"shard": shard["shard"], "primary": primary, "preferred": replicas[0]["name"],
            "state": read[primary]["state"] if primary is not None else None,
            "epoch": read[primary]["epoch"] if primary is not None else max(epochs, default=None),
            "public": shard["public"], "backups": backups}


def to_table(status: dict[str, Any]) -> str:
    """The report for people: a row per shard and backup, then a row per node and process."""
    rows = []
    for shard in status["shards"]:
        head = [str(shard["shard"]), shard["primary"] or "(none)", shard["preferred"], _text(shard["epoch"])]
        for i, b in enumerate(shard["backups"] or [{"name": "", "state": "", "lag": "", "lag_seconds": ""}]):
            rows.append((head if i == 0 else [""] * len(head)) +
                        [b["name"], b["state"], _text(b["lag"]), _text(b["lag_seconds"])])
    lines = table(["shard", "primary", "preferred", "epoch", "backup", "state", "lag msgs", "lag s"], rows)
    rows = [[node["node"] if i == 0 else "", p["name"], str(p["shard"]), p["role"] or "-", p["state"]]
            for node in status["nodes"] for i, p in enumerate(node["processes"])]
    return "\n".join([*lines, "", *table(["node", "process", "shard", "role", "state"], rows)])


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
