"""packaging/pcs-shard-setup.sh without a live cluster: the script writes into a CIB file (`PCS="pcs -f FILE"`)
from a cluster file of 3 nodes in 2 racks and 3 shards of 2 replicas with its pacemaker: VIPs (the placement
`haqueue place --config` derives from it); the test reads the clones (the agent's `shard` parameter on the
file), VIPs and constraints back from the CIB's XML, then lets Pacemaker's own scheduler (`crm_simulate`) run
that CIB on three simulated nodes: every shard promoted on its preferred primary's node with its VIP there,
instances only on its replicas; and, with the agent's promotion scores injected, a preferred primary that crashes is replaced by
the ready backup (not restarted in place as primary), leaves the primary there while it catches up, and
takes it back once ready (design/sharding.md, "Coordination")."""
from __future__ import annotations

import json
import os
import sys
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from harness import run_haqueue

REPO = Path(__file__).resolve().parents[2]
NODES = ["n1", "n2", "n3"]
RACKS = {"n1": "r1", "n2": "r1", "n3": "r2"}
VIPS = {"n1": "192.0.2.101", "n2": "192.0.2.102", "n3": "192.0.2.103"}
SHARD_VIPS = [f"192.0.2.{110 + i}" for i in range(3)]
BINARY = Path(sys.executable).with_name("haqueue")  # this tree's, which derives the placement
# the agent's promotion scores (agents/haqueue; design/pacemaker.md)
PRIMARY_SCORE, READY_SCORE, CATCHING_UP_SCORE, FRESHEST_SCORE = 10000, 1000, 10, 1

pytestmark = pytest.mark.skipif(not all(shutil.which(p) for p in ("pcs", "cibadmin", "crm_simulate", "crm_mon")),
                                reason="needs pcs and pacemaker-cli-utils (make setup installs them)")


def run(args: list[str], env: dict[str, str] | None = None) -> str:
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert r.returncode == 0, f"{args}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return r.stdout


def simulate(cib: Path, *args: str) -> None:
    """One transition of Pacemaker's scheduler on the CIB file, written back with its outcome."""
    out = cib.with_suffix(".next.xml")
    run(["crm_simulate", "-x", str(cib), *args, "-S", "-O", str(out)])
    out.replace(cib)


def promotion_score(cib: Path, node: str, shard: int, score: int) -> None:
    """What the agent's monitor sets (crm_attribute --promotion) on `node` for shard's instance there."""
    run(["crm_attribute", "-N", node, "-l", "reboot", "-n", f"master-haqueue-s{shard}", "-v", str(score)],
        env={"CIB_file": str(cib)})


def roles(cib: Path) -> dict[str, dict[str, str]]:
    """Resource id -> {node: role} of what runs, as crm_mon reads it from the CIB file."""
    mon = ET.fromstring(run(["crm_mon", "-1", "--output-as=xml"], env={"CIB_file": str(cib)}))
    found: dict[str, dict[str, str]] = {}
    for resource in mon.iter("resource"):
        for node in resource.iter("node"):
            found.setdefault(resource.get("id"), {})[node.get("name")] = resource.get("role")
    return found


def promoted(cib: Path, shard: int) -> list[str]:
    return sorted(n for n, role in roles(cib).get(f"haqueue-s{shard}", {}).items() if role == "Promoted")


def expressions(rule: ET.Element) -> list[tuple[str | None, ...]]:
    return [(e.get("attribute"), e.get("operation"), e.get("value")) for e in rule.findall("expression")]


def nvpairs(element: ET.Element, tag: str) -> dict[str, str]:
    return {p.get("name"): p.get("value") for block in element.findall(tag) for p in block.findall("nvpair")}


@pytest.mark.slow  # about 15 s: a dozen pcs calls
def test_pcs_shard_setup_makes_one_promotable_clone_per_shard_as_placed(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({
        "shards": 3, "replicas": 2, "nodes": {n: {"address": f"10.0.0.{i}", "rack": RACKS[n]}
                                              for i, n in enumerate(NODES, 1)},
        "pacemaker": {"node_vips": VIPS, "shard_vips": SHARD_VIPS}, "ha": {"username": "ha", "password": "p"}}))
    r = run_haqueue(["place", "--config", str(cluster), "--format", "json"])
    assert r.returncode == 0, r.stderr
    shards = {s["shard"]: s["replicas"] for s in json.loads(r.stdout)["shards"]}
    assert all(len({RACKS[n] for n in replicas}) == 2 for replicas in shards.values())
    cib = tmp_path / "cib.xml"
    cib.write_text(run(["cibadmin", "--empty"]))
    run(["sh", str(REPO / "packaging" / "pcs-shard-setup.sh"), str(cluster)],
        env={"PCS": f"pcs -f {cib}", "FORCE": "--force", "BINARY": str(BINARY)})

    # What the CIB says, read back as XML
    root = ET.parse(cib).getroot()
    clones = {c.get("id"): c for c in root.iter("clone")}
    locations = list(root.iter("rsc_location"))
    assert sorted(clones) == sorted(f"haqueue-s{i}-clone" for i in shards)
    for i, replicas in shards.items():
        clone = clones[f"haqueue-s{i}-clone"]
        meta = nvpairs(clone, "meta_attributes")
        assert (meta["promotable"], meta["clone-max"], meta["promoted-max"], meta["clone-node-max"]) == \
            ("true", "2", "1", "1")
        primitive = clone.find("primitive")
        assert (primitive.get("id"), primitive.get("class"), primitive.get("provider"), primitive.get("type")) == \
            (f"haqueue-s{i}", "ocf", "haqueue", "haqueue")
        params = nvpairs(primitive, "instance_attributes")
        # the shard's process of the one cluster file: haqueue broker --config CLUSTER --node <node> --shard i
        assert (params["config"], params["shard"], params["binary"]) == (str(cluster), str(i), str(BINARY))
        assert params["logfile"] == f"/var/log/haqueue/shard-{i}.log"
        mine = [c for c in locations if c.get("rsc") == clone.get("id")]
        banned = sorted(c.get("node") for c in mine if c.get("score") == "-INFINITY")
        assert banned == sorted(set(NODES) - set(replicas))
        [rule] = [rule for c in mine for rule in c.findall("rule")]
        assert (rule.get("role"), rule.get("score"), rule.get("boolean-op")) == ("Promoted", "9500", "and")
        assert expressions(rule) == [("#uname", "eq", replicas[0])]
        [scored] = rule.findall("rule")  # only while primary or ready (>= 1000), or the freshest of a new cluster (1)
        assert scored.get("boolean-op") == "or"
        assert expressions(scored) == [(f"master-haqueue-s{i}", "gte", "1000"), (f"master-haqueue-s{i}", "eq", "1")]
    colocations = {(c.get("rsc"), c.get("with-rsc"), c.get("with-rsc-role"), c.get("score"))
                   for c in root.iter("rsc_colocation")}
    orders = {(o.get("first"), o.get("first-action"), o.get("then"), o.get("then-action")) for o in root.iter("rsc_order")}
    for i, ip in enumerate(SHARD_VIPS):  # the shard's direct address: on its primary's node, after the promotion
        vip = next(p for p in root.iter("primitive") if p.get("id") == f"haqueue-s{i}-vip")
        assert (vip.get("type"), nvpairs(vip, "instance_attributes")["ip"]) == ("IPaddr2", ip)
        assert (f"haqueue-s{i}-vip", f"haqueue-s{i}-clone", "Promoted", "INFINITY") in colocations
        assert (f"haqueue-s{i}-clone", "promote", f"haqueue-s{i}-vip", "start") in orders
    for node, ip in VIPS.items():
        vip = next(p for p in root.iter("primitive") if p.get("id") == f"haqueue-vip-{node}")
        assert (vip.get("type"), nvpairs(vip, "instance_attributes")["ip"]) == ("IPaddr2", ip)
        assert [(c.get("node"), c.get("score")) for c in locations if c.get("rsc") == vip.get("id")] == [(node, "100")]

    # Pacemaker's scheduler on three simulated nodes (no quorum or fencing in a simulation)
    for name, value in (("stonith-enabled", "false"), ("no-quorum-policy", "ignore")):
        run(["crm_attribute", "-t", "crm_config", "-n", name, "-v", value], env={"CIB_file": str(cib)})
    simulate(cib, *(a for n in NODES for a in ("-u", n)))  # probes
    for i, replicas in shards.items():  # a brand-new cluster: every broker the freshest (the agent's 1)
        for node in replicas:
            promotion_score(cib, node, i, FRESHEST_SCORE)
    simulate(cib)  # starts and promotions
    running = roles(cib)
    for i, replicas in shards.items():
        assert sorted(running[f"haqueue-s{i}"]) == sorted(replicas)
        assert promoted(cib, i) == [replicas[0]]
        assert running[f"haqueue-s{i}-vip"] == {replicas[0]: "Started"}
    assert all(running[f"haqueue-vip-{n}"] == {n: "Started"} for n in NODES)

    # Shard 0's preferred primary crashes; its monitor fails and its stop clears its score, while the other
    # replica is a ready backup: that one is promoted, not the preferred broker restarted in place (joining)
    preferred, other = shards[0]
    promotion_score(cib, other, 0, READY_SCORE)
    run(["crm_attribute", "-N", preferred, "-l", "reboot", "-n", "master-haqueue-s0", "-D"], env={"CIB_file": str(cib)})
    simulate(cib, "--op-inject", f"haqueue-s0_monitor_2000@{preferred}=7")
    simulate(cib)
    assert promoted(cib, 0) == [other] and preferred in roles(cib)["haqueue-s0"]
    assert roles(cib)["haqueue-s0-vip"] == {other: "Started"}  # the relays' way to shard 0 follows its primary
    # It catches up (10): 10 < 10000, the primary stays
    promotion_score(cib, other, 0, PRIMARY_SCORE)
    promotion_score(cib, preferred, 0, CATCHING_UP_SCORE)
    simulate(cib)
    assert promoted(cib, 0) == [other]
    # Ready: 9500 + 1000 > 10000, Pacemaker demotes the primary elsewhere and promotes the preferred one
    promotion_score(cib, preferred, 0, READY_SCORE)
    simulate(cib)
    assert promoted(cib, 0) == [preferred]
    assert roles(cib)["haqueue-s0-vip"] == {preferred: "Started"}
