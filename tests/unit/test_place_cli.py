"""`haqueue place`, run as a user runs it: the assignment as a table or JSON, rebalancing with --from and
the moves it prints, and bad input refused with exit code 2 naming the problem."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import run_haqueue


def place(*args: str) -> tuple[int, str, str]:
    result = run_haqueue(["place", *args])
    return result.returncode, result.stdout, result.stderr


def test_json_lists_each_shard_with_its_preferred_primary_first() -> None:
    code, out, err = place("--nodes", "n1,n2,n3", "--shards", "3", "--replicas", "3", "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"shards": [{"shard": 0, "replicas": ["n1", "n2", "n3"]},
                                          {"shard": 1, "replicas": ["n2", "n3", "n1"]},
                                          {"shard": 2, "replicas": ["n3", "n1", "n2"]}],
                               "nodes": ["n1", "n2", "n3"]}


def test_the_placement_of_a_cluster_file_with_its_pacemaker_vips(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("shards: 2\nreplicas: 2\nnodes: {a: {address: 10.0.0.1}, b: {address: 10.0.0.2}}\n"
                       "pacemaker: {node_vips: {a: 10.0.0.101, b: 10.0.0.102}, shard_vips: [10.0.0.110, 10.0.0.111]}\n"
                       "ha: {username: ha, password: p}\n")
    code, out, err = place("--config", str(cluster), "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"shards": [{"shard": 0, "replicas": ["a", "b"]}, {"shard": 1, "replicas": ["b", "a"]}],
                               "nodes": ["a", "b"],
                               "pacemaker": {"node_vips": {"a": "10.0.0.101", "b": "10.0.0.102"},
                                             "shard_vips": ["10.0.0.110", "10.0.0.111"]}}
    code, _, err = place("--config", str(cluster), "--shards", "3")
    assert code == 2 and "--config takes the nodes, shards and replicas from the cluster file" in err
    cluster.write_text("shards: 2\n")
    code, _, err = place("--config", str(cluster))
    assert code == 2 and f"{cluster}: replicas: missing" in err
    cluster.write_text("shards: 2\nreplicas: 1\nnodes: {a: {address: 10.0.0.1}}\nshard_public: 10.0.1.1:5800\n"
                       "ha: {username: ha, password: p}\n")
    code, out, err = place("--config", str(cluster), "--store")  # stored only by ZooKeeper (tests/zookeeper)
    assert (code, out) == (2, "") and "--store: " + f"{cluster} has no ha.coordinator: zookeeper" in err


def test_the_table_shows_shards_and_what_each_node_holds() -> None:
    code, out, _ = place("--nodes", "a1,a2,b1,b2", "--shards", "4", "--replicas", "2",
                         "--rack", "a1=A", "--rack", "a2=A", "--rack", "b1=B", "--rack", "b2=B")
    assert code == 0
    assert out.splitlines() == [
        "shard  replicas (preferred primary first)",
        "0      a1 b1",
        "1      b1 a2",
        "2      a2 b2",
        "3      b2 a1",
        "",
        "node  primaries  replicas",
        "a1            1         2",
        "a2            1         2",
        "b1            1         2",
        "b2            1         2",
    ]


def test_too_few_racks_is_a_warning_not_an_error() -> None:
    code, out, err = place("--nodes", "a1,a2,b1", "--shards", "2", "--replicas", "3", "--format", "json",
                           "--rack", "a1=A", "--rack", "a2=A", "--rack", "b1=B")
    assert code == 0
    assert "warning: only 2 racks for 3 replicas" in err
    assert len(json.loads(out)["shards"]) == 2


def test_from_an_earlier_assignment_prints_the_new_one_and_the_moves(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    code, out, _ = place("--nodes", "n1,n2,n3", "--shards", "6", "--replicas", "2", "--format", "json")
    old.write_text(out)
    code, out, err = place("--nodes", "n1,n2,n3,n4", "--from", str(old), "--format", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    moves = document["moves"]
    assert len(moves) == 12 // 4  # n4's share of the 12 replicas; nothing else moves
    assert all(move["to"] == "n4" for move in moves)
    assert sum("n4" in shard["replicas"] for shard in document["shards"]) == 3
    assert document["nodes"] == ["n1", "n2", "n3", "n4"]

    code, out, _ = place("--nodes", "n1,n2,n3,n4", "--from", str(old))
    assert code == 0
    assert "moves: 3" in out.splitlines()
    assert f"  shard {moves[0]['shard']}: {moves[0]['from']} -> n4" in out.splitlines()


def test_from_the_same_nodes_moves_nothing(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(place("--nodes", "n1,n2,n3,n4,n5", "--shards", "2", "--replicas", "2", "--format", "json")[1])
    code, out, _ = place("--nodes", "n1,n2,n3,n4,n5", "--from", str(old), "--format", "json")
    assert code == 0
    assert json.loads(out)["moves"] == [] and json.loads(out)["leader_changes"] == []


def test_removing_a_node_moves_its_replicas_and_its_primaries(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(place("--nodes", "n1,n2,n3", "--shards", "3", "--replicas", "2", "--format", "json")[1])
    code, out, _ = place("--nodes", "n1,n3", "--from", str(old), "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert sorted((m["shard"], m["from"]) for m in document["moves"]) == [(0, "n2"), (1, "n2")]
    assert [m["shard"] for m in document["leader_changes"]] == [1]
    assert all(sorted(shard["replicas"]) == ["n1", "n3"] for shard in document["shards"])


def test_the_output_does_not_depend_on_the_process() -> None:
    args = ["place", "--nodes", "x,y,z,w,v", "--shards", "7", "--replicas", "3", "--rack", "x=1", "--rack", "y=2",
            "--rack", "z=1", "--rack", "w=3", "--rack", "v=2", "--format", "json"]
    outputs = {run_haqueue(args, env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(outputs) == 1


@pytest.mark.parametrize("args, message", [
    (["--nodes", "n1,n2", "--shards", "3", "--replicas", "3"],
     "place: 3 replicas need 3 nodes, but there are only 2 (n1, n2)"),
    (["--nodes", "n1,n2,n1", "--shards", "3", "--replicas", "1"], "place: node 'n1' is named twice"),
    (["--nodes", "n1,,n2", "--shards", "3", "--replicas", "1"], "place: bad node name ''"),
    (["--nodes", "n1,n2", "--shards", "3", "--replicas", "1", "--rack", "n9=A"],
     "place: rack given for unknown node 'n9' (the nodes are n1, n2)"),
    (["--nodes", "n1,n2", "--shards", "3", "--replicas", "1", "--rack", "n1=A"],
     "place: no rack for n2: give every node a rack, or none"),
    (["--nodes", "n1,n2", "--shards", "3", "--replicas", "1", "--rack", "n1=A", "--rack", "n1=B"],
     "place: --rack: node 'n1' given twice"),
    (["--nodes", "n1,n2", "--shards", "3", "--replicas", "1", "--region", "n1"], "expected NODE=VALUE, got 'n1'"),
    (["--nodes", "n1,n2", "--shards", "0", "--replicas", "1"], "place: shards must be at least 1, got 0"),
    (["--nodes", "n1,n2", "--replicas", "1"], "place: --shards and --replicas are required"),
    (["--nodes", "n1,n2", "--shards", "2", "--replicas", "1", "--format", "yaml"], "invalid choice: 'yaml'"),
    (["--nodes", "n1,n2", "--shards", "2", "--replicas", "1", "--store"], "place: --store needs --config"),
])
def test_bad_input_exits_2_naming_the_problem(args: list[str], message: str) -> None:
    code, out, err = place(*args)
    assert (code, out) == (2, "")
    assert message in err


@pytest.mark.parametrize("content, message", [
    (None, "cannot read: No such file or directory"),
    ("{not json", "not JSON"),
    ('{"shards": [{"shard": 1, "replicas": ["n1"]}]}', 'shards[0]: expected {"shard": 0, "replicas": [...]}'),
    ('{"shards": [{"shard": 0, "replicas": "n1"}]}', "shards[0].replicas: expected a list of node names"),
    ('{"shards": [{"shard": 0, "replicas": ["n1", "n2"]}, {"shard": 1, "replicas": ["n2"]}]}',
     "shard 1 has 1 replicas but shard 0 has 2"),
])
def test_a_bad_from_file_exits_2_naming_it(tmp_path: Path, content: str | None, message: str) -> None:
    old = tmp_path / "old.json"
    if content is not None:
        old.write_text(content)
    code, _, err = place("--nodes", "n1,n2", "--from", str(old))
    assert code == 2
    assert message in err
    if content is None or "shard 1" not in message:
        assert str(old) in err


def test_from_refuses_a_different_shard_count(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(place("--nodes", "n1,n2,n3", "--shards", "3", "--replicas", "2", "--format", "json")[1])
    code, _, err = place("--nodes", "n1,n2,n3", "--from", str(old), "--shards", "4")
    assert code == 2
    assert f"--shards 4, but {old} has 3" in err
