"""Step 6 of design/sharding.md under a real ZooKeeper ensemble: a sharded cluster's processes elect one primary
per shard on `<path>/shards/<i>`, each shard's first replica marked preferred; the first process stores the
cluster's assignment at `<path>/assignment`, and a process whose cluster file gives another placement does not
start."""
from __future__ import annotations

import copy
import json
import secrets
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "shard"))

from ha_harness import cluster_factory, receive, run_haqueue, send_all, wait_for  # noqa: E402
from shard_harness import ShardCluster, owned_by  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def zk_shards(tmp_path, ensemble):
    yield from cluster_factory(ShardCluster, tmp_path, fail_on_crash=False)


def test_shards_elect_on_their_own_paths_and_agree_on_the_stored_assignment(zk_shards, ensemble, tmp_path) -> None:
    from kazoo.client import KazooClient

    path = f"/haqueue/{secrets.token_hex(4)}"
    zookeeper = {"coordinator": "zookeeper", "zookeeper": {"hosts": ensemble.hosts, "path": path,
                                                           "session_timeout": 3.0}}
    c = zk_shards(size=2, shards=2, replicas=2, extra={"ha": zookeeper})
    c.start()
    zk = KazooClient(hosts=ensemble.hosts)
    zk.start(timeout=10)
    try:
        def primary_of(shard: int) -> str | None:
            found = zk.exists(f"{path}/shards/{shard}/primary")
            return json.loads(zk.get(f"{path}/shards/{shard}/primary")[0])["name"] if found else None
        primaries = [wait_for(lambda: primary_of(shard), 30, message=f"shard {shard}'s primary") for shard in (0, 1)]
        assert [p.split(".")[1] for p in primaries] == ["s0", "s1"]  # one election per shard, among its replicas
        assert json.loads(zk.get(f"{path}/assignment")[0]) == {
            "shards": [{"shard": 0, "replicas": ["n1", "n2"]}, {"shard": 1, "replicas": ["n2", "n1"]}],
            "nodes": ["n1", "n2"], "format": 1}
        members = {name: json.loads(zk.get(f"{path}/shards/{shard}/members/{name}")[0])["preferred"]
                   for shard in (0, 1) for name in zk.get_children(f"{path}/shards/{shard}/members")}
        assert members == {"n1.s0": True, "n2.s0": False, "n2.s1": True, "n1.s1": False}
    finally:
        zk.stop()
        zk.close()
    for shard in (0, 1):
        c.wait_state(c.process(primaries[shard].split(".")[0], shard), "primary", "active", timeout=30)
    queue = owned_by(1, "zk.sharded")
    send_all(c.client_address("n1"), queue, ["a", "b"])
    assert [m.body for m in receive(c.client_address("n2"), queue, 2)] == ["a", "b"]

    other = copy.deepcopy(c.config)  # the same cluster with one replica per shard: another placement
    other["replicas"] = 1
    for node in other["nodes"].values():
        node["data_dir"] = str(tmp_path / "other")
    file = tmp_path / "other.yaml"
    file.write_text(yaml.safe_dump(other))
    out = run_haqueue(["broker", "--config", str(file), "--node", "n1", "--shard", "0"], timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"the cluster file's placement is not the cluster's, stored at {path}/assignment: shard 0's replicas " \
           f"are ['n1', 'n2'] there, ['n1'] here" in out.stderr


def test_the_admin_replaces_the_stored_assignment_only_when_told_to(zk_shards, ensemble, tmp_path) -> None:
    """`place --config FILE --store` stores the file's placement, leaves a different stored one (exit 1, naming
    the difference) unless given --replace; after the replacement, the new file's processes start and elect, and
    a process of the old file exits 1."""
    from kazoo.client import KazooClient

    path = f"/haqueue/{secrets.token_hex(4)}"
    zookeeper = {"coordinator": "zookeeper", "zookeeper": {"hosts": ensemble.hosts, "path": path,
                                                           "session_timeout": 3.0}}
    c = zk_shards(size=2, shards=2, replicas=1, extra={"ha": zookeeper})  # the new placement: one replica a shard
    old = copy.deepcopy(c.config)
    old["replicas"] = 2
    files = {}
    for name, config in (("old", old), ("new", c.config)):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(config))
    store = lambda name, *more: run_haqueue(["place", "--config", str(files[name]), "--store", *more])  # noqa: E731
    placement = lambda name: json.loads(run_haqueue(["place", "--config", str(files[name]), "--format", "json"])  # noqa: E731
                                        .stdout)
    zk = KazooClient(hosts=ensemble.hosts)
    zk.start(timeout=10)
    try:
        stored = lambda: json.loads(zk.get(f"{path}/assignment")[0])  # noqa: E731
        as_stored = lambda name: {**placement(name), "format": 1}  # noqa: E731  (design/data-formats.md)
        out = store("old")
        assert out.returncode == 0 and f"stored the assignment at {path}/assignment" in out.stderr, out.stderr
        assert stored() == as_stored("old")
        assert placement("old") == {"shards": [{"shard": 0, "replicas": ["n1", "n2"]},
                                               {"shard": 1, "replicas": ["n2", "n1"]}], "nodes": ["n1", "n2"]}
        out = store("old")
        assert out.returncode == 0 and "holds this assignment already" in out.stderr, out.stderr
        out = store("new")  # not without --replace
        assert out.returncode == 1, out.stderr
        assert f"{path}/assignment holds another assignment: shard 0's replicas are ['n1', 'n2'] there, ['n1'] " \
               f"here; give --replace to replace it" in out.stderr
        assert stored() == as_stored("old")
        out = store("new", "--replace")
        assert out.returncode == 0 and f"replaced the assignment at {path}/assignment" in out.stderr, out.stderr
        assert stored() == as_stored("new")
        out = run_haqueue(["place", "--config", str(files["new"]), "--replace"])
        assert out.returncode == 2 and "--replace is for --store" in out.stderr
    finally:
        zk.stop()
        zk.close()

    c.start()  # the new placement's processes (n1.s0, n2.s1): accepted, and each shard elects its one replica
    for b in c.brokers:
        c.wait_state(b, "primary", "active", timeout=30)
    out = run_haqueue(["broker", "--config", str(files["old"]), "--node", "n1", "--shard", "0"], timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"stored at {path}/assignment: shard 0's replicas are ['n1'] there, ['n1', 'n2'] here" in out.stderr
