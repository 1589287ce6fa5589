"""Connection limits count clients only: an exempt user (HA's peers) is counted nowhere, not even per address;
the clients' limit is limits.max_connections, else what the file descriptors allow, and the sockets accepted
at all leave room for peers and handshakes."""
from __future__ import annotations

import logging

from haqueue.broker.connection_limits import PEER_ROOM, ConnectionLimits
from haqueue.config import LimitsConfig


def test_without_max_connections_the_descriptors_bound_the_clients():
    limits = ConnectionLimits(LimitsConfig(), 20_000)
    assert (limits.max_clients, limits.max_sockets) == (18_000 - PEER_ROOM, 18_000)  # a tenth kept for files
    assert limits.clients_limit() == "17900, what RLIMIT_NOFILE 20000 allows"


def test_max_connections_bounds_the_clients_and_leaves_room_for_peers():
    limits = ConnectionLimits(LimitsConfig(max_connections=20), 20_000)
    assert (limits.max_clients, limits.max_sockets) == (20, 20 + PEER_ROOM)
    for _ in range(20):
        assert limits.opened("10.0.0.1", "anonymous", limits.accepted("10.0.0.1")) is None
    assert limits.opened("10.0.0.1", "alice", None) == "too many connections (limits.max_connections 20)"
    limits.closed("10.0.0.1", "anonymous")
    assert limits.opened("10.0.0.1", "alice", None) is None


def test_max_connections_above_the_descriptors_is_cut_to_them_with_a_warning(caplog):
    with caplog.at_level(logging.INFO, logger="haqueue.engine"):
        limits = ConnectionLimits(LimitsConfig(max_connections=50_000), 20_000)
    assert limits.max_clients == 17_900
    assert "limits.max_connections 50000 is more than RLIMIT_NOFILE 20000 allows: clients beyond 17900 are " \
           "refused" in caplog.text


def test_an_exempt_user_counts_against_no_client_limit():
    limits = ConnectionLimits(LimitsConfig(max_connections=1, max_connections_per_address=1,
                                           max_connections_per_user=1), 20_000)
    limits.exempt_users.add("ha")
    assert limits.opened("10.0.0.1", "alice", limits.accepted("10.0.0.1")) is None
    refusal = limits.accepted("10.0.0.1")
    assert refusal == "too many connections from 10.0.0.1 (limits.max_connections_per_address 1)"
    assert limits.opened("10.0.0.1", "ha", refusal) is None
    assert limits.opened("10.0.0.1", "ha", limits.accepted("10.0.0.1")) is None
    assert (limits.clients, limits.by_address["10.0.0.1"], limits.by_user) == (1, 1, {"alice": 1})
    limits.closed("10.0.0.1", "ha")
    limits.closed("10.0.0.1", "alice")
    assert (limits.clients, limits.by_address, limits.by_user) == (0, {}, {})
    assert limits.exempt("ha") and not limits.exempt("alice") and not limits.exempt(None)


def test_a_refused_connection_is_counted_per_address_until_it_goes():
    limits = ConnectionLimits(LimitsConfig(max_connections_per_user=1), 20_000)
    assert limits.opened("h", "bob", limits.accepted("h")) is None
    refusal = limits.opened("h", "bob", limits.accepted("h"))
    assert refusal == "too many connections for user 'bob' (limits.max_connections_per_user 1)"
    limits.closed("h", None)
    assert (limits.clients, limits.by_address["h"], limits.by_user["bob"]) == (1, 1, 1)
