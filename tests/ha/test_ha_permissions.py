"""Permissions in a cluster (design/permissions.md): the peer user (ha.username) opens HA links and runs
the admin operations, and nothing else; a backup, which refuses clients, lets in admin tools whose user
may run admin operations."""
from __future__ import annotations

import json

import pytest
from proton.reactor import Copy
from proton.utils import BlockingConnection, LinkDetached

from ha_harness import HA_USER, OPS_USER, HaCluster, connect, run_haqueue

UNAUTHORIZED = "amqp:unauthorized-access"
# everything but the admin operations
APP = {"password": "app-secret", "allow": {"send": ["*"], "receive": ["*"], "manage": ["*"]}}


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def refusal(attach) -> tuple[str, str]:
    with pytest.raises(LinkDetached) as e:
        attach()
    return e.value.link.remote_condition.name, e.value.link.remote_condition.description


def test_peer_user_runs_admin_operations_and_nothing_else(ha_cluster):
    c: HaCluster = ha_cluster(size=2)
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "q")
    # what the supervisor and the OCF agent ask, on the primary and on a backup
    for b in (p, c[1]):
        for command in (["ha", "status"], ["status"], ["ha", "ping"], ["queue", "list"]):
            r = c.cli(b, *command, user=HA_USER)
            assert r.returncode == 0, (b.name, command, r.stderr)
    r = c.cli(p, "queue", "add", "q2", user=HA_USER)
    assert (r.returncode, last_line(r.stderr)) == (1, f"haqueue: user '{HA_USER}' may not manage 'q2'")
    r = c.cli(p, "queue", "del", "q", user=HA_USER)
    assert (r.returncode, last_line(r.stderr)) == (1, f"haqueue: user '{HA_USER}' may not manage 'q'")
    conn = connect(p.address, user=HA_USER, password=c.password)
    try:
        assert refusal(lambda: conn.create_sender("q")) == (UNAUTHORIZED, f"user '{HA_USER}' may not send to 'q'")
        assert refusal(lambda: conn.create_receiver("q", name="consumer")) == \
            (UNAUTHORIZED, f"user '{HA_USER}' may not receive from 'q'")
        assert refusal(lambda: conn.create_receiver("q", name="browser", options=Copy())) == \
            (UNAUTHORIZED, f"user '{HA_USER}' may not receive from 'q'")
    finally:
        conn.close()
    # and only the peer user opens HA links, whatever else a user may do
    conn = connect(p.address, user=OPS_USER, password=c.password)
    try:
        assert refusal(lambda: conn.create_receiver("$ha.wiring")) == \
            (UNAUTHORIZED, f"$ha.wiring is for HA peers (user {OPS_USER} is not)")
    finally:
        conn.close()


def test_backup_admits_admin_tools_whose_user_may_run_admin_operations(ha_cluster):
    c: HaCluster = ha_cluster(size=2, extra={"users": {"app": APP}})
    p = c.start_cluster()
    b = c[1]
    # an admin user's admin tool: status and the lists
    r = c.cli(b, "ha", "status", user=OPS_USER)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["role"] == "backup"
    # a user that may not run admin operations is refused like any client, admin tool or not
    r = run_haqueue(["admin", "-b", b.address, "--user", "app", "--password", APP["password"], "queue", "list"])
    assert r.returncode == 2 and "is a backup" in r.stderr, r.stderr
    r = run_haqueue(["admin", "-b", p.address, "--user", "app", "--password", APP["password"], "queue", "list"])
    assert r.returncode == 0, r.stderr  # on the primary it may list what it may touch
    # an admin user's client that does not say it is an admin tool is refused: a failover-capable client
    # moves on to the primary at once
    with pytest.raises(Exception) as e:
        conn = BlockingConnection(f"amqp://{b.address}", timeout=5, reconnect=False, allowed_mechs="PLAIN",
                                  user=OPS_USER, password=c.password)
        try:
            conn.create_sender("q")
        finally:
            conn.close()
    assert "is a backup" in str(e.value), str(e.value)


def test_ha_links_without_link_properties_leave_the_primary_serving(ha_cluster):
    """A peer's HA links as a stock client opens them, with no link properties (proton then has none to
    give, not an empty map): the primary answers them and keeps serving."""
    c: HaCluster = ha_cluster(size=2)
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "q")
    conn = connect(p.address, user=HA_USER, password=c.password)
    try:
        for address in ("$ha.wiring", "$ha.queue/q"):
            try:
                conn.create_receiver(address, name=f"bare {address}")
            except LinkDetached:
                pass  # refused or served: either way, answered
    finally:
        conn.close()
    assert p.running
    assert c.status(p)["role"] == "primary"
