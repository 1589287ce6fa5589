"""shard/cluster_config.py: one cluster file gives each (node, shard) process its ordinary broker config;
a bad file is refused naming the file, the key and the reason (haqueue place's own checks among them)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from haqueue.config import ConfigError, ShardConfig, load_config
from haqueue.shard.cluster_config import shard_process_config

CLUSTER = """
    shards: 4
    replicas: 2
    nodes:
      n1: {address: 10.0.0.1, rack: r1}
      n2: {address: 10.0.0.2, rack: r2, data_dir: /srv/n2}
      n3: {address: 10.0.0.3, rack: r1}
    client_port: 5672
    peer_base: 5700
    shard_public: 10.0.1.1:5800
    data_dir: /var/lib/haqueue
    users: {app: secret}
    ha: {username: ha, password: p, backup_timeout: 2}
"""
# the cluster under Pacemaker (packaging/pcs-shard-setup.sh): VIPs instead of shard_public
PACEMAKER = ("pacemaker: {node_vips: {n1: 10.9.0.1, n2: 10.9.0.2, n3: 10.9.0.3}, "
             "shard_vips: [10.9.1.0, 10.9.1.1, 10.9.1.2, 10.9.1.3], shard_port: 5800}")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_each_process_gets_its_shards_broker_config(tmp_path: Path) -> None:
    path = write(tmp_path, CLUSTER)
    # placement order with racks r1, r2: n1, n2, n3; shard 1's replicas walk from n2: n2 then n3 (other rack)
    config = shard_process_config(path, "n2", 1)
    assert config.name == "n2.s1"
    assert config.data_dir == "/srv/n2/shard-1"
    assert [(l.host, l.port, l.reuse_port) for l in config.listen] == [("10.0.0.2", 5672, True),
                                                                       ("10.0.0.2", 5701, False)]
    assert config.ha is not None
    assert config.ha.brokers == [("10.0.0.2", 5701), ("10.0.0.3", 5701)]
    assert config.ha.public == ("10.0.1.1", 5801)
    assert config.ha.backup_timeout == 2.0
    assert "app" in config.users
    replicas = [["n1", "n2"], ["n2", "n3"], ["n3", "n2"], ["n1", "n2"]]  # each shard's, its preferred primary first
    addresses = {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}
    assert config.shard == ShardConfig(1, 4, [("10.0.1.1", 5800 + i) for i in range(4)], ("10.0.0.2", 5672),
                                       [[(n, (addresses[n], 5700 + i)) for n in on] for i, on in enumerate(replicas)],
                                       assignment={"shards": [{"shard": i, "replicas": on}
                                                              for i, on in enumerate(replicas)],
                                                   "nodes": ["n1", "n2", "n3"]})
    assert not config.shard.redirect
    assert config.shard.relay_timeout == 60.0  # a failover under Pacemaker, not ha.backup_timeout (2 s here)
    options = shard_process_config(write(tmp_path, CLUSTER + "    shard: {redirect: true, relay_timeout: 7.5}\n"),
                                   "n1", 0).shard
    assert options.redirect and options.relay_timeout == 7.5
    other = shard_process_config(path, "n1", 0)
    assert other.data_dir == "/var/lib/haqueue/shard-0"
    assert other.ha is not None and other.ha.brokers[0] == ("10.0.0.1", 5700)  # the preferred primary first
    assert config.http is None  # no console unless the file has an http section
    consoles = write(tmp_path, CLUSTER + "    http: {port: 15672, allow_origins: ['https://ops.example']}\n")
    http = shard_process_config(consoles, "n2", 1).http
    assert http is not None and (http.listen, http.allow_origins) == (("10.0.0.2", 15673), ["https://ops.example"])


def test_under_pacemaker_the_vips_reach_every_process_and_it_binds_no_public_address(tmp_path: Path) -> None:
    path = write(tmp_path, textwrap.dedent(CLUSTER).replace("shard_public: 10.0.1.1:5800", PACEMAKER))
    config = shard_process_config(path, "n2", 1)
    # the node's client port and the shard's direct port on every address (the node's VIP and the shard's come
    # and go), the peer listener on the node's own address, as in ha.brokers
    assert [(l.host, l.port, l.reuse_port) for l in config.listen] == [("0.0.0.0", 5672, True),
                                                                       ("10.0.0.2", 5701, False),
                                                                       ("0.0.0.0", 5801, False)]
    assert config.ha is not None and config.ha.public is None  # Pacemaker's VIP is the shard's public address
    assert config.ha.brokers == [("10.0.0.2", 5701), ("10.0.0.3", 5701)]
    assert config.shard is not None
    assert config.shard.publics == [(f"10.9.1.{i}", 5800 + i) for i in range(4)]  # the relay's, by each shard's VIP
    assert config.shard.client == ("0.0.0.0", 5672)  # where a backup admits clients


@pytest.mark.parametrize("sync, preferred", [("all", True), ("all_disk", True), ("quorum_disk", False)])
def test_under_zookeeper_each_shard_elects_on_its_own_path_its_first_replica_preferred(
        tmp_path: Path, sync: str, preferred: bool) -> None:
    zookeeper = ("backup_timeout: 2}", f"backup_timeout: 2, sync: {sync}, coordinator: zookeeper, "
                                       "zookeeper: {hosts: ['127.0.0.1:2181'], path: /prod/queues, weight: 3}}")
    path = write(tmp_path, textwrap.dedent(CLUSTER).replace(*zookeeper))
    configs = {(node, shard): shard_process_config(path, node, shard).ha
               for node, shard in (("n2", 1), ("n3", 1), ("n1", 3), ("n2", 3))}
    for (node, shard), ha in configs.items():
        assert ha is not None and ha.zookeeper is not None
        assert ha.zookeeper.path == f"/prod/queues/shards/{shard}"
        assert ha.zookeeper.hosts == [("127.0.0.1", 2181)] and ha.zookeeper.weight == 3
        first = node == ("n2" if shard == 1 else "n1")  # the placement's first replica of the shard
        assert ha.zookeeper.preferred is (first and preferred), (node, shard)
        assert shard_process_config(path, node, shard).shard.zookeeper_path == "/prod/queues"  # the assignment's
    assert shard_process_config(write(tmp_path, CLUSTER), "n1", 0).ha.zookeeper is None  # no coordinator: none


@pytest.mark.parametrize("node, shard, message", [
    ("n9", 0, "nodes: no node 'n9' (the nodes are n1, n2, n3)"),
    ("n1", 4, "shards: no shard 4: the shards are 0 to 3"),
    ("n1", 1, "nodes: shard 1 has no replica on n1 (its replicas are on n2, n3)"),
])
def test_a_process_the_placement_does_not_have_is_refused(tmp_path: Path, node: str, shard: int,
                                                          message: str) -> None:
    path = write(tmp_path, CLUSTER)
    with pytest.raises(ConfigError) as e:
        shard_process_config(path, node, shard)
    assert str(e.value) == f"{path}: {message}"


@pytest.mark.parametrize("change, message", [
    (("replicas: 2", "replicas: 4"), "nodes: 4 replicas need 4 nodes, but there are only 3 (n1, n2, n3): "
                                     "each replica of a shard is on its own node"),
    (("n3: {address: 10.0.0.3, rack: r1}", "n3: {address: 10.0.0.3}"),
     "nodes: no rack for n3: give every node a rack, or none"),
    (("shards: 4", "shards: 0"), "shards: must be an integer >= 1, got 0"),
    (("shard_public: 10.0.1.1:5800", "shard_public: nowhere"),
     'shard_public: must be HOST:PORT with a port 1..65535, got "nowhere"'),
    (("n1: {address: 10.0.0.1, rack: r1}", "n1: {rack: r1}"), "nodes.n1.address: missing"),
    (("n1: {address: 10.0.0.1, rack: r1}", "n1: {address: 10.0.0.1, rack: r1, port: 1}"),
     "nodes.n1.port: unknown key (known: address, rack, region, data_dir)"),
    (("data_dir: /var/lib/haqueue", "listen: [127.0.0.1:5672]"),
     "listen: not in a cluster's config: each process listens on its node's client address and its shard's "
     "peer port"),
    (("backup_timeout: 2}", "backup_timeout: 2, public: 1.2.3.4:5}"),
     "ha.public: not in a cluster's config: each shard's direct address is shard_public's port + its index, or its "
     "VIP (pacemaker)"),
    (("client_port: 5672", "http: {listen: 10.0.0.1:15672}"), "http.listen: not in a cluster's config: shard i's "
                                                              "process serves its console on its node's address, "
                                                              "port http.port + i"),
    (("client_port: 5672", "http: {tls: {cert_file: c, key_file: k}}"), "http.port: missing: shard i's process "
                                                                        "serves its console on its node's address, "
                                                                        "port + i"),
    (("client_port: 5672", "http: {port: 65534}"), "http.port: leaves no room for 4 shards' ports (its port + "
                                                   "shard <= 65535)"),
    (("backup_timeout: 2}", "backup_timeout: -1}"), "ha.backup_timeout: must be a non-negative number of "
                                                    "seconds, got -1"),
    (("client_port: 5672", "client_port: 5702"), "client_port: is among the shards' peer ports 5700..5703"),
    (("client_port: 5672", "shard: {redirect: 1}"), "shard.redirect: must be true or false, got 1"),
    (("backup_timeout: 2}", "backup_timeout: 2, coordinator: zookeeper, zookeeper: {hosts: ['h:1'], preferred: true}}"),
     "ha.zookeeper.preferred: not in a cluster's config: each shard's preferred primary is the first of its "
     "replicas in the placement"),
    (("client_port: 5672", "shard: {relay: false}"), "shard.relay: unknown key (known: redirect, relay_timeout)"),
    (("client_port: 5672", "shard: {relay_timeout: 0}"), "shard.relay_timeout: must be a positive number of "
                                                         "seconds, got 0"),
    (("client_port: 5672", "shard: {relay_timeout: 1 minute}"), "shard.relay_timeout: must be a non-negative "
                                                                "number of seconds, got \"1 minute\""),
    (("shard_public: 10.0.1.1:5800", "client_port: 5672"), "shard_public: missing (or a pacemaker: section): each "
                                                           "shard's direct address"),
    (("client_port: 5672", PACEMAKER), "shard_public: not with pacemaker: each shard's direct address is its VIP "
                                       "(pacemaker.shard_vips)"),
    (("shard_public: 10.0.1.1:5800", PACEMAKER.replace(", n3: 10.9.0.3", "")),
     "pacemaker.node_vips: must give a VIP for each node (n1, n2, n3), got n1, n2"),
    (("shard_public: 10.0.1.1:5800", PACEMAKER.replace(", 10.9.1.3", "")),
     "pacemaker.shard_vips: must give a VIP for each of the 4 shards, got 3"),
    (("shard_public: 10.0.1.1:5800", PACEMAKER.replace("shard_vips", "vips")),
     "pacemaker.vips: unknown key (known: node_vips, shard_vips, shard_port)"),
    (("shard_public: 10.0.1.1:5800", PACEMAKER.replace("shard_port: 5800", "shard_port: 65535")),
     "pacemaker.shard_port: leaves no room for 4 shards' ports (its port + shard <= 65535)"),
    (("backup_timeout: 2}", "backup_timeout: 2, coordinator: zookeeper, zookeeper: {hosts: ['h:1']}}\n"
                            + PACEMAKER.replace("shard_public: 10.0.1.1:5800", "")),
     "pacemaker: not with ha.coordinator: zookeeper (Pacemaker decides the roles)"),
])
def test_a_bad_cluster_file_names_file_key_and_reason(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    text = textwrap.dedent(CLUSTER)
    assert change[0] in text
    path = write(tmp_path, text.replace(change[0], change[1]))
    with pytest.raises(ConfigError) as e:
        shard_process_config(path, "n1", 0)
    assert str(e.value) == f"{path}: {message}"


def test_a_cluster_file_without_node_and_shard_is_refused_as_a_broker_config(tmp_path: Path) -> None:
    path = write(tmp_path, CLUSTER)
    with pytest.raises(ConfigError, match="shards: a sharded cluster's config: run one shard's process of it with "
                                          "--node NODE --shard I"):
        load_config(path)


def test_each_shard_holds_the_files_queues_it_owns_and_forwarding_queues_for_the_others(tmp_path: Path) -> None:
    from haqueue.shard.forwarding_queues import FORWARD
    from haqueue.shard.ownership import shard_of_name
    def named(prefix: str, here: bool) -> str:  # a name of shard 1 (here), or of another
        return next(f"{prefix}{i}" for i in range(100) if (shard_of_name(f"{prefix}{i}", 4) == 1) == here)
    own, other, unlisted = named("q", True), named("q", False), named("u", False)
    path = write(tmp_path, CLUSTER + f"""
    queues:
      - {{name: {own}, args: {{max_depth: 5}}}}
      - {{name: {other}, args: {{durable: false, max_depth: 5}}}}
      - {{name: placed, args: {{x-shard: 1}}}}
    exchanges: [{{name: events, type: fanout}}]
    bindings: [{{exchange: events, queue: {other}}}, {{exchange: events, queue: {unlisted}}}]
    """)
    config = shard_process_config(path, "n2", 1)
    args = {q.name: q.args for q in config.queues}
    assert args[own] == {"max_depth": 5} and args["placed"] == {"x-shard": 1}  # its own, as they are
    assert args[other] == {FORWARD: shard_of_name(other, 4), "durable": False}  # forwarding: no limits of its own
    assert args[unlisted] == {FORWARD: shard_of_name(unlisted, 4)}


def test_a_bad_x_shard_in_the_files_queues_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, CLUSTER + """
    queues: [{name: a}, {name: b, args: {x-shard: 4}}]
    """)
    with pytest.raises(ConfigError) as e:
        shard_process_config(path, "n2", 1)
    assert str(e.value) == f"{path}: queues[1]: x-shard must be a shard number from 0 to 3, got 4"
