"""Step 7 of design/sharding.md: with `shard.redirect: true` a link to a queue of another shard is refused with
amqp:link:redirect, its info naming the owning shard's direct address ({network-host, port, address}); a client
that follows it reaches the owner's primary there and is served."""
from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from ha_harness import connect, receive
from shard_harness import no_copy, owned_by

pytestmark = pytest.mark.timeout(120)
REDIRECT = "amqp:link:redirect"


def attach(address: str, queue: str, sender: bool) -> tuple[BlockingConnection, Any, list[dict[str, Any]], str]:
    """A link to `queue` at `address`, following redirects as a client that knows them does: (connection, link,
    the info of each redirect followed, the address that served it)."""
    followed: list[dict[str, Any]] = []
    for _ in range(3):
        conn = connect(address)
        try:
            link = conn.create_sender(queue) if sender else conn.create_receiver(queue)
            return conn, link, followed, address
        except LinkDetached as e:
            condition = e.link.remote_condition
            conn.close()
            assert condition is not None and condition.name == REDIRECT, condition
            followed.append(dict(condition.info))
            address, queue = f"{condition.info['network-host']}:{condition.info['port']}", condition.info["address"]
    raise AssertionError(f"redirected again and again: {followed}")


def test_a_client_follows_the_redirect_to_the_owning_shard(shard_cluster) -> None:
    c = shard_cluster(size=2, shards=2, replicas=2, extra={"shard": {"redirect": True}})
    c.start_shards()
    queue = owned_by(1, "redirected")
    conn, sender, followed, _ = attach(c.client_address("n1"), queue, sender=True)  # n1 has no primary of shard 1
    try:
        for i in range(20):
            sender.send(Message(body=f"m{i}"))  # returns once the owner confirmed it
    finally:
        conn.close()
    host, port = c.publics[1].split(":")
    assert followed == [{"network-host": host, "port": int(port), "address": queue}]  # one hop, to shard 1
    primary, backup = c.shard_processes(1)
    assert c.depth(primary, queue) == 20
    for b in c.shard_processes(0):  # nothing was relayed, nor made where the client came first
        assert no_copy(c.queues(b).get(queue)), c.queues(b).get(queue)

    conn, _, followed, served_at = attach(c.client_address("n1"), queue, sender=False)  # a consumer likewise
    conn.close()
    assert followed == [{"network-host": host, "port": int(port), "address": queue}]
    assert [m.body for m in receive(served_at, queue, 20)] == [f"m{i}" for i in range(20)]
    c.wait_depth(backup, queue, 0)
