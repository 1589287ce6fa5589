#!/bin/sh
# Installs the haqueue OCF resource agent as ocf:haqueue:haqueue. Run it as root on every
# cluster node (the agent must exist on each node before `pcs resource create`).
#
# Usage: packaging/install-agent.sh [--uninstall]
#   OCF_ROOT   the OCF root [/usr/lib/ocf]; the agent goes to $OCF_ROOT/resource.d/haqueue/haqueue
#   DESTDIR    a staging root for packagers [empty]
set -eu

here=$(cd "$(dirname "$0")" && pwd)
agent="$here/../agents/haqueue"
: "${OCF_ROOT:=/usr/lib/ocf}"
: "${DESTDIR:=}"
provider="$DESTDIR$OCF_ROOT/resource.d/haqueue"

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$provider/haqueue"
    rmdir "$provider" 2>/dev/null || true
    echo "removed $provider/haqueue"
    exit 0
fi
if [ $# -gt 0 ]; then
    echo "usage: $0 [--uninstall]" >&2
    exit 2
fi

install -d -m 0755 "$provider"
install -m 0755 "$agent" "$provider/haqueue"

# The meta-data must be valid XML (pcs reads it to check the resource's parameters).
if [ -r "$OCF_ROOT/lib/heartbeat/ocf-shellfuncs" ] && command -v xmllint >/dev/null 2>&1; then
    OCF_ROOT="$OCF_ROOT" "$provider/haqueue" meta-data | xmllint --noout -
fi
echo "installed $provider/haqueue (ocf:haqueue:haqueue)"
