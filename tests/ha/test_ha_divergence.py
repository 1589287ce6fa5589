"""Divergence (design/replication.md): a primary cut off from its backups holds its clients' publishes
unconfirmed (the floor); when another broker has taken over and the old primary rejoins, what it holds that
the new primary never had is kept aside in a diverged file, not deleted, and `haqueue diverged republish`
sends it to the new primary. Real brokers; the cut is SIGSTOP of both backups, then kill -9 of the primary."""
from __future__ import annotations

import json

import pytest
from proton import Message

from clients import Client
from ha_harness import receive, send_all
from harness import run_haqueue, wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_rejoining_primary_keeps_aside_what_the_new_primary_never_had(ha_cluster):
    c = ha_cluster(backup_timeout=1.0)
    p = c.start_cluster()
    send_all(c.public, "q", [Message(body=i, durable=True) for i in range(10)])
    for b in c.brokers[1:]:
        c.wait_depth(b, "q", 10)

    c.sigstop(c[1])
    c.sigstop(c[2])
    with Client(c.public) as client:  # published to a primary alone: held, never confirmed
        sender = client.sender("q")
        first = sender.link.send(Message(body=10, durable=True))  # the backups' sockets take it, and it them
        wait_for(lambda: client.idle(0.1) or c.status(p)["holders"] == 1, 10, message="both backups dropped")
        held = [first] + [sender.link.send(Message(body=i, durable=True)) for i in range(11, 30)]
        client.wait(lambda: c.depth(p, "q") == 30, 10, "the 20 on the cut-off primary's queue")
        client.idle(0.5)
        assert not any(d.settled for d in held), "confirmed by the primary alone"
    c.kill(p)
    journal = json.loads(run_haqueue(["store", "check", str(p.directory / "data")]).stdout)
    assert journal["queues"]["q"] == 30  # its journal has the 20 the backups never had

    c.sigcont(c[1])
    c.sigcont(c[2])
    c.promote(c[1], force=True)
    c.wait_backups_ready(c[1], ["b2"])
    send_all(c.public, "q", [Message(body=i, durable=True) for i in range(100, 105)])

    c.start(0)  # the old primary rejoins as a backup of b1
    c.wait_backups_ready(c[1], ["b0", "b2"])
    # its queue is the new primary's, and what it alone held is kept aside (body 10 reached the backups'
    # sockets before they were dropped: b1 has it)
    assert c.bodies(p, "q") == c.bodies(c[1], "q") == [*range(11), *range(100, 105)]
    status = c.status(p)["diverged"]
    assert (status["files"], status["messages"], status["kept_since_start"]) == (1, 19, 19)
    assert "never on the new primary" in p.log() and "that this primary never had" in c[1].log()
    listed = [json.loads(line) for line in run_haqueue(["diverged", "list", str(p.directory / "data")]).stdout.splitlines()]
    assert [(f["queue"], f["messages"]) for f in listed] == [("q", 19)]

    again = run_haqueue(["diverged", "republish", str(p.directory / "data"), "--to", c.public])
    assert again.returncode == 0, again.stderr
    assert [json.loads(line)["republished"] for line in again.stdout.splitlines()] == [19]
    assert run_haqueue(["diverged", "list", str(p.directory / "data")]).stdout == ""
    assert run_haqueue(["diverged", "republish", str(p.directory / "data"), "--to", c.public]).stdout == ""
    assert sorted(m.body for m in receive(c.public, "q", 35)) == [*range(30), *range(100, 105)]


def test_a_new_primary_adopts_what_only_another_backup_holds(ha_cluster):
    """quorum_mem: what the primary and b2 confirmed while b1 was stopped, b1 lacks; b1 is promoted when the primary
    dies, and b2's rejoin gives it those messages (adopted, not kept aside); the old primary's own copies, rejoining
    after that, are removed as adopted."""
    c = ha_cluster(backup_timeout=1.0, ha_extra={"sync": "quorum_mem"})
    p = c.start_cluster()
    send_all(c.public, "q", [Message(body=i, durable=True) for i in range(10)])
    for b in c.brokers[1:]:
        c.wait_depth(b, "q", 10)

    c.sigstop(c[1])
    send_all(c.public, "q", [Message(body=10, durable=True)])  # confirmed by b0 and b2; b1 is dropped for it
    wait_for(lambda: [b["name"] for b in c.status(p)["backups"]] == ["b2"], 10, message="b1 dropped")
    send_all(c.public, "q", [Message(body=i, durable=True) for i in range(11, 30)])
    c.wait_depth(c[2], "q", 30)
    c.kill(p)
    c.sigcont(c[1])
    held = c.status(c[1])
    assert held["state"] == "ready" and c.depth(c[1], "q") < 30
    c.promote(c[1])
    c.wait_backups_ready(c[1], ["b2"])
    assert sorted(c.bodies(c[1], "q")) == list(range(30))
    assert c.status(c[1])["adopted"] >= 19 and "adopting them" in c[1].log()
    assert c.status(c[2])["diverged"]["files"] == 0

    c.start(0)  # the old primary rejoins: it numbered them, b1 adopted them from b2: removed, not kept aside
    c.wait_backups_ready(c[1], ["b0", "b2"])
    assert c.bodies(p, "q") == c.bodies(c[2], "q") == c.bodies(c[1], "q")
    assert c.status(p)["diverged"]["files"] == 0
    assert sorted(m.body for m in receive(c.public, "q", 30)) == list(range(30))
    assert c.depth(c[1], "q") == 0
