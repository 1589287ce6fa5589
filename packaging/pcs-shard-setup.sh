#!/bin/sh
# Creates the Pacemaker resources for a sharded haqueue cluster with pcs (run once, on any one node,
# after the cluster is up and the agent is installed on every node: packaging/install-agent.sh),
# from the placement `haqueue place --format json` printed (design/sharding.md, "Coordination"):
#
#   haqueue-s<i>-clone   per shard i, a promotable clone of ocf:haqueue:haqueue with the config
#                        CONFIG_DIR/shard-<i>.yaml: one broker on each of the shard's R replica nodes
#                        (clone-max=R, -INFINITY on every other node), one promoted (its primary),
#                        and a promoted-role score of 9500 on its preferred primary's node while the
#                        broker there is primary or ready (or the freshest of a new cluster), so that a
#                        ready broker there outranks a primary elsewhere (the agent's scores: primary
#                        10000, ready 1000-1999, catching up 10): the preferred primary is re-elected
#                        once it is ready again, never while it is catching up or joining
#   haqueue-vip-<node>   per node, an ocf:heartbeat:IPaddr2 virtual IP: the node's client address,
#                        on its node while that is up, on another node (whose processes relay) when not
#
# Usage: VIPS=n1=192.0.2.101,n2=192.0.2.102,n3=192.0.2.103 packaging/pcs-shard-setup.sh PLACEMENT.json
#
# Settings (environment variables; defaults in brackets):
#   VIPS           NODE=IP for every node of the placement, comma-separated (required)
#   CIDR_NETMASK   the VIPs' prefix length [24]
#   NIC            the interface they go on [eth0]
#   CONFIG_DIR     the shard configs, shard-<i>.yaml, on every node [/etc/haqueue]
#   BINARY         the haqueue command [/usr/local/bin/haqueue]
#   DATA_DIR       the shards' directories, DATA_DIR/shard-<i> [/var/lib/haqueue]
#   LOG_DIR        the shards' logs, LOG_DIR/shard-<i>.log [/var/log/haqueue]
#   PING_TIMEOUT   seconds a broker has to answer a monitor [3]
#   PREFERRED_SCORE  the preferred primary's promoted-role score [9500]
#   PCS            the pcs command [pcs]; PCS="pcs -f cib.xml" edits a CIB file instead, which
#                  you then push with `pcs cluster cib-push cib.xml`
#   FORCE          --force: as for pcs-setup.sh, which makes each shard's clone (beside this script)
#
# Every shard's config must have an ha: section listing its R brokers and no ha.public; each node's
# client listener is on 0.0.0.0 (or the node's VIP) so that its VIP reaches it. See design/pacemaker.md.
set -eu

HERE=$(dirname "$0")
PLACEMENT="${1:?usage: VIPS=NODE=IP,... $0 PLACEMENT.json (from haqueue place --format json)}"
: "${VIPS:?set VIPS to NODE=IP,... for every node}"
: "${CIDR_NETMASK:=24}"
: "${NIC:=eth0}"
: "${CONFIG_DIR:=/etc/haqueue}"
: "${BINARY:=/usr/local/bin/haqueue}"
: "${DATA_DIR:=/var/lib/haqueue}"
: "${LOG_DIR:=/var/log/haqueue}"
: "${PING_TIMEOUT:=3}"
: "${PREFERRED_SCORE:=9500}"
: "${PCS:=pcs}"
: "${FORCE:=}"

# One line per shard: "shard <i> <preferred primary> <R> <other nodes, comma-separated, or ->",
# then one per node: "node <name> <vip>". Every node: those the placement was made for, else those holding a replica.
PLAN=$(python3 - "$PLACEMENT" "$VIPS" <<'EOF'
import json
import sys

try:
    with open(sys.argv[1]) as f:
        placement = json.load(f)
    shards = placement["shards"]
    nodes = list(placement.get("nodes") or dict.fromkeys(n for s in shards for n in s["replicas"]))
except (OSError, ValueError, KeyError, TypeError) as e:
    sys.exit(f"{sys.argv[1]}: not a placement from `haqueue place --format json`: {e}")
vips = dict(item.split("=", 1) for item in sys.argv[2].split(",") if "=" in item)
missing = [n for n in nodes if not vips.get(n)]
if missing:
    sys.exit(f"VIPS: no address for {', '.join(missing)}")
for s in shards:
    replicas = s["replicas"]
    others = [n for n in nodes if n not in replicas]
    print("shard", s["shard"], replicas[0], len(replicas), ",".join(others) or "-")
for n in nodes:
    print("node", n, vips[n])
EOF
)

set -x

echo "$PLAN" | while read -r kind shard preferred replicas others; do
    [ "$kind" = shard ] || continue
    clone="haqueue-s${shard}-clone"
    # The shard's clone, as pcs-setup.sh makes the clone of an unsharded cluster (without its VIP).
    VIP=none RESOURCE="haqueue-s${shard}" CONFIG="$CONFIG_DIR/shard-${shard}.yaml" DATA_DIR="$DATA_DIR/shard-${shard}" \
        LOGFILE="$LOG_DIR/shard-${shard}.log" NODES="$replicas" BINARY="$BINARY" PING_TIMEOUT="$PING_TIMEOUT" \
        PCS="$PCS" FORCE="$FORCE" sh "$HERE/pcs-setup.sh" </dev/null
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
