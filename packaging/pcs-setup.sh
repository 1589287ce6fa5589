#!/bin/sh
# Creates the Pacemaker resources for a haqueue cluster with pcs (run once, on any one node, after
# the cluster is up and the agent is installed on every node: packaging/install-agent.sh):
#
#   haqueue-clone  a promotable clone of ocf:haqueue:haqueue, one broker per node, one promoted
#                  (the primary)
#   haqueue-vip    an ocf:heartbeat:IPaddr2 virtual IP, the clients' address: colocated with the
#                  promoted instance and started only after the promotion
#
# Usage: VIP=192.0.2.100 packaging/pcs-setup.sh
#
# Settings (environment variables; defaults in brackets):
#   VIP            the virtual IP (required); none: the clone alone
#   CIDR_NETMASK   its prefix length [24]
#   NIC            the interface it goes on [eth0]
#   CONFIG         the broker config on every node [/etc/haqueue/haqueue.yaml]
#   BINARY         the haqueue command [/usr/local/bin/haqueue]
#   DATA_DIR       the broker's directory [/var/lib/haqueue]
#   LOGFILE        the broker's log [/var/log/haqueue/haqueue.log]
#   PING_TIMEOUT   seconds a broker has to answer a monitor [3]
#   NODES          clone-max: how many brokers [3]
#   RESOURCE       the resource name; the clone is RESOURCE-clone [haqueue]
#   SHARD          empty, or a shard's index: CONFIG is then a sharded cluster's file and each broker
#                  that shard's process on its node (pcs-shard-setup.sh makes a clone per shard so) []
#   PCS            the pcs command [pcs]; PCS="pcs -f cib.xml" edits a CIB file instead, which
#                  you then push with `pcs cluster cib-push cib.xml`
#   FORCE          set to --force to create the clone where the agent is not installed (a CIB file
#                  prepared on another machine): pcs then cannot check the agent's parameters
#
# The broker configs must have an ha: section listing every broker and no ha.public (the VIP is
# the public address); each broker listens on 0.0.0.0 (or the VIP's port on all addresses) so
# that the VIP reaches it. See design/pacemaker.md.
set -eu

: "${VIP:?set VIP to the virtual IP clients connect to}"
: "${CIDR_NETMASK:=24}"
: "${NIC:=eth0}"
: "${CONFIG:=/etc/haqueue/haqueue.yaml}"
: "${BINARY:=/usr/local/bin/haqueue}"
: "${DATA_DIR:=/var/lib/haqueue}"
: "${LOGFILE:=/var/log/haqueue/haqueue.log}"
: "${PING_TIMEOUT:=3}"
: "${NODES:=3}"
: "${RESOURCE:=haqueue}"
: "${SHARD:=}"
: "${PCS:=pcs}"
: "${FORCE:=}"

CLONE="${RESOURCE}-clone"

set -x

# The brokers. Monitors: every 2 s on the primary, 3 s on the backups (the intervals must differ
# per role); a broker that does not answer within PING_TIMEOUT fails its monitor. Demote is a
# restart as a backup (stop, then start), so it gets the sum of both timeouts.
# shellcheck disable=SC2086  # FORCE is empty or one word
$PCS resource create "$RESOURCE" ocf:haqueue:haqueue $FORCE \
    config="$CONFIG" ${SHARD:+shard="$SHARD"} binary="$BINARY" data_dir="$DATA_DIR" logfile="$LOGFILE" ping_timeout="$PING_TIMEOUT" \
    op start timeout=30s \
    op stop timeout=30s \
    op promote timeout=30s \
    op demote timeout=60s \
    op monitor interval=2s timeout=15s role=Promoted \
    op monitor interval=3s timeout=15s role=Unpromoted \
    op notify timeout=10s \
    promotable "$CLONE" promoted-max=1 promoted-node-max=1 clone-max="$NODES" clone-node-max=1 notify=false

[ "$VIP" != none ] || exit 0

# The clients' address follows the primary.
$PCS resource create "${RESOURCE}-vip" ocf:heartbeat:IPaddr2 \
    ip="$VIP" cidr_netmask="$CIDR_NETMASK" nic="$NIC" \
    op monitor interval=5s timeout=20s

$PCS constraint colocation add "${RESOURCE}-vip" with Promoted "$CLONE" INFINITY
# Symmetrical: the VIP also stops before the primary is demoted.
$PCS constraint order promote "$CLONE" then start "${RESOURCE}-vip"
