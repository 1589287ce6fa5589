"""shard/status.py: the cluster report put together from the layout and each process's `ha status` answer."""
from __future__ import annotations

from typing import Any

from haqueue.admin import AdminError
from haqueue.shard.status import cluster_status, read_all, to_table

LAYOUT = {"shards": [{"shard": 0, "public": "10.0.1.1:5800", "replicas": [
    {"name": "n1.s0", "node": "n1", "address": "10.0.0.1:5700"},
    {"name": "n2.s0", "node": "n2", "address": "10.0.0.2:5700"},
    {"name": "n3.s0", "node": "n3", "address": "10.0.0.3:5700"}]}]}


def primary(epoch: int, *backups: tuple[str, str, int]) -> dict[str, Any]:
    return {"role": "primary", "state": "active", "epoch": epoch,
            "backups": [{"name": n, "state": s, "lag": lag, "lag_seconds": 0.5} for n, s, lag in backups]}


def backup(state: str, epoch: int) -> dict[str, Any]:
    return {"role": "backup", "state": state, "epoch": epoch}


def test_the_primary_s_view_of_its_backups_and_a_backup_not_attached_to_it() -> None:
    answers = {"n1.s0": backup("joining", 3), "n2.s0": primary(3, ("n3.s0", "catchup", 120)),
               "n3.s0": backup("catchup", 3)}
    status = cluster_status(LAYOUT, answers)
    assert status["shards"] == [{"shard": 0, "primary": "n2.s0", "preferred": "n1.s0", "state": "active", "epoch": 3,
                                 "public": "10.0.1.1:5800", "backups": [
                                     {"name": "n1.s0", "node": "n1", "state": "joining", "lag": None,
                                      "lag_seconds": None},
                                     {"name": "n3.s0", "node": "n3", "state": "catchup", "lag": 120,
                                      "lag_seconds": 0.5}]}]
    assert status["nodes"][1] == {"node": "n2", "processes": [{"name": "n2.s0", "shard": 0, "role": "primary",
                                                               "state": "active"}]}


def test_no_primary_an_unreachable_process_and_a_deposed_primary() -> None:
    answers = {"n1.s0": "cannot connect to 10.0.0.1:5700: refused", "n2.s0": backup("ready", 4),
               "n3.s0": backup("ready", 5)}
    s = cluster_status(LAYOUT, answers)["shards"][0]
    assert (s["primary"], s["state"], s["epoch"]) == (None, None, 5)  # no primary: the highest epoch seen
    assert s["backups"][0] == {"name": "n1.s0", "node": "n1", "state": "unreachable", "lag": None,
                               "lag_seconds": None, "error": "cannot connect to 10.0.0.1:5700: refused"}
    answers["n1.s0"] = primary(4)  # a deposed primary, not yet fenced, next to the new one
    answers["n3.s0"] = primary(5, ("n2.s0", "ready", 0))
    s = cluster_status(LAYOUT, answers)["shards"][0]
    assert (s["primary"], s["epoch"]) == ("n3.s0", 5)
    assert [(b["name"], b["state"]) for b in s["backups"]] == [("n1.s0", "primary (deposed)"), ("n2.s0", "ready")]


def test_read_all_keeps_why_a_process_did_not_answer_and_the_table_shows_it() -> None:
    def read(address: str) -> dict[str, Any]:
        if address == "10.0.0.3:5700":
            raise AdminError("10.0.0.3:5700: no answer to READ ha within 10 s")
        return primary(2, ("n2.s0", "ready", 0)) if address == "10.0.0.1:5700" else backup("ready", 2)
    status = cluster_status(LAYOUT, read_all(LAYOUT, read))
    assert status["nodes"][2]["processes"][0]["error"] == "10.0.0.3:5700: no answer to READ ha within 10 s"
    assert to_table(status).splitlines() == [
        "shard  primary  preferred  epoch  backup        state  lag msgs  lag s",
        "0        n1.s0      n1.s0      2   n2.s0        ready         0    0.5",
        "                                   n3.s0  unreachable         -      -",
        "",
        "node  process  shard     role        state",
        "n1      n1.s0      0  primary       active",
        "n2      n2.s0      0   backup        ready",
        "n3      n3.s0      0        -  unreachable"]
