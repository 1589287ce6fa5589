#!/bin/sh
# Creates the Pacemaker resources for a sharded haqueue cluster with pcs (run once, on any one node,
# after the cluster is up and the agent is installed on every node: packaging/install-agent.sh),
# from the cluster's one file (design/sharding.md), whose placement `haqueue place --config` derives
# and whose pacemaker: section gives the VIPs:
#
#   haqueue-s<i>-clone   per shard i, a promotable clone of ocf:haqueue:haqueue with shard=i: on each of
#                        the shard's R replica nodes the process `haqueue broker --config CLUSTER --node
#                        <node> --shard i` (clone-max=R, -INFINITY on every other node), one promoted
#                        (its primary), and a promoted-role score of 9500 on its preferred primary's node
#                        while the broker there is primary or ready (or the freshest of a new cluster), so
#                        that a ready broker there outranks a primary elsewhere (the agent's scores: primary
#                        10000, ready 1000-1999, catching up 10): the preferred primary is re-elected
#                        once it is ready again, never while it is catching up or joining
#   haqueue-s<i>-vip     per shard, an ocf:heartbeat:IPaddr2 virtual IP (pacemaker.shard_vips[i]) colocated
#                        with the promoted instance and started after the promotion: the shard's direct
#                        address, where the other shards' processes relay its queues' links
#   haqueue-vip-<node>   per node, an ocf:heartbeat:IPaddr2 virtual IP (pacemaker.node_vips): the node's
#                        client address, on its node while that is up, on another node (whose processes
#                        relay) when not
#
# Usage: packaging/pcs-shard-setup.sh CLUSTER.yaml
#   CLUSTER.yaml is read here and given to the agent: the same absolute path on every node.
#
# Settings (environment variables; defaults in brackets):
#   CIDR_NETMASK   the VIPs' prefix length [24]
#   NIC            the interface they go on [eth0]
#   BINARY         the haqueue command, on every node and here [/usr/local/bin/haqueue]
#   DATA_DIR       the brokers' working directory (the file's data_dir holds shard-<i>) [/var/lib/haqueue]
#   LOG_DIR        the shards' logs, LOG_DIR/shard-<i>.log [/var/log/haqueue]
#   PING_TIMEOUT   seconds a broker has to answer a monitor [3]
#   PREFERRED_SCORE  the preferred primary's promoted-role score [9500]
#   PCS            the pcs command [pcs]; PCS="pcs -f cib.xml" edits a CIB file instead, which
#                  you then push with `pcs cluster cib-push cib.xml`
#   FORCE          --force: as for pcs-setup.sh, which makes each shard's clone (beside this script)
#
# The file must have a pacemaker: section (node_vips, shard_vips) instead of shard_public: each process then
# binds the node's client port and its shard's direct port on every address, so that the VIPs reach it,
# and has no ha.public (design/pacemaker.md).
set -eu

HERE=$(dirname "$0")
CLUSTER="${1:?usage: $0 CLUSTER.yaml (the sharded cluster's file, with a pacemaker: section)}"
case "$CLUSTER" in
/*) ;;
*) echo "$0: $CLUSTER: give the absolute path, the same on every node (the agent reads it there)" >&2; exit 2;;
esac
: "${CIDR_NETMASK:=24}"
: "${NIC:=eth0}"
: "${BINARY:=/usr/local/bin/haqueue}"
: "${DATA_DIR:=/var/lib/haqueue}"
: "${LOG_DIR:=/var/log/haqueue}"
: "${PING_TIMEOUT:=3}"
: "${PREFERRED_SCORE:=9500}"
: "${PCS:=pcs}"
: "${FORCE:=}"

# One line per shard: "shard <i> <preferred primary> <R> <other nodes, comma-separated, or -> <vip>",
# then one per node: "node <name> <vip>".
PLACEMENT=$("$BINARY" place --config "$CLUSTER" --format json)
PLAN=$(echo "$PLACEMENT" | python3 -c '
import json
import sys

placement = json.load(sys.stdin)
vips = placement.get("pacemaker")
if not vips:
    sys.exit(f"{sys.argv[1]}: no pacemaker: section (node_vips, shard_vips)")
nodes = placement["nodes"]
for s in placement["shards"]:
    replicas = s["replicas"]
    others = [n for n in nodes if n not in replicas]
    print("shard", s["shard"], replicas[0], len(replicas), ",".join(others) or "-", vips["shard_vips"][s["shard"]])
for n in nodes:
    print("node", n, vips["node_vips"][n])
' "$CLUSTER")

set -x

echo "$PLAN" | while read -r kind shard preferred replicas others vip; do
    [ "$kind" = shard ] || continue
    clone="haqueue-s${shard}-clone"
    # The shard's clone and its VIP, as pcs-setup.sh makes those of an unsharded cluster, the agent running
    # the shard's process of the cluster file.
    VIP="$vip" CIDR_NETMASK="$CIDR_NETMASK" NIC="$NIC" RESOURCE="haqueue-s${shard}" SHARD="$shard" CONFIG="$CLUSTER" \
        DATA_DIR="$DATA_DIR" LOGFILE="$LOG_DIR/shard-${shard}.log" NODES="$replicas" BINARY="$BINARY" \
        PING_TIMEOUT="$PING_TIMEOUT" PCS="$PCS" FORCE="$FORCE" sh "$HERE/pcs-setup.sh" </dev/null
    if [ "$others" != - ]; then
        # shellcheck disable=SC2046  # one word per node
        $PCS constraint location "$clone" avoids $(echo "$others" | tr ',' ' ')
    fi
    # Only while the broker there is primary or ready (its promotion score >= 1000), or the freshest of a
    # new or restarting cluster (1): a preferred broker restarted after a crash (no score) or catching up
    # (10) must not outrank a ready backup elsewhere, which alone holds every confirmed message.
    $PCS constraint location "$clone" rule constraint-id="haqueue-s${shard}-preferred" role=Promoted \
        score="$PREFERRED_SCORE" '#uname' eq "$preferred" and \
        '(' "master-haqueue-s${shard}" gte integer 1000 or "master-haqueue-s${shard}" eq integer 1 ')'
done

echo "$PLAN" | while read -r kind node vip; do
    [ "$kind" = node ] || continue
    $PCS resource create "haqueue-vip-${node}" ocf:heartbeat:IPaddr2 \
        ip="$vip" cidr_netmask="$CIDR_NETMASK" nic="$NIC" \
        op monitor interval=5s timeout=20s
    $PCS constraint location "haqueue-vip-${node}" prefers "${node}=100"
done
