"""The floor under every sync mode (ha.min_confirmations, design/replication.md): a primary left with fewer
than a majority of the cluster holding new messages confirms nothing, says so, and confirms what it held
once a backup is back; `min_confirmations: 1` is the documented opt-out. Real brokers; backups cut off by
SIGSTOP, which the primary cannot tell from a partition."""
from __future__ import annotations

import pytest
from proton import Message

from clients import Client
from ha_harness import with_metrics
from harness import wait_for
from metrics_scrape import scrape, value

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("sync", ["all", "quorum_mem"])
def test_a_primary_left_alone_confirms_nothing_until_a_backup_is_back(ha_cluster, sync):
    c = ha_cluster(backup_timeout=1.0, ha_extra={"sync": sync})
    metrics = with_metrics(c)
    p = c.start_cluster()
    status = c.status(p)
    assert (status["min_confirmations"], status["holders"], status["confirming"]) == (2, 3, True)

    c.sigstop(c[2])  # one backup gone: a majority remains, publishes go on once it is dropped
    with Client(c.public) as client:
        first = client.publish("q", [Message(body=i, durable=True) for i in range(50)])
        client.wait(lambda: all(d.settled for d in first), 10, "confirmation by the majority left")
        assert all(d.remote_state == d.ACCEPTED for d in first)
    wait_for(lambda: c.status(p)["holders"] == 2, 10, message="b2 dropped")
    assert c.status(p)["confirming"]

    c.sigstop(c[1])  # the last backup gone too: the primary alone must not confirm
    with Client(c.public) as client:
        held = client.publish("q", [Message(body=i, durable=True) for i in range(50, 100)])
        client.idle(2.5)  # longer than backup_timeout: b1 is dropped, and its holds go with it
        assert not any(d.settled for d in held), "confirmed by the primary alone"
        status = c.status(p)
        assert (status["holders"], status["confirming"]) == (1, False)
        samples = scrape(metrics[p.name])
        assert value(samples, "haqueue_ha_confirming") == 0 and value(samples, "haqueue_ha_holders") == 1
        assert value(samples, "haqueue_ha_publishes_waiting") == 50
        assert "only 1 of 3 brokers hold new messages, 2 must" in p.log()

        c.sigcont(c[1])  # back: it catches up, and what the primary held is confirmed
        client.wait(lambda: all(d.settled for d in held), 15, "confirmation once a backup is back")
        assert all(d.remote_state == d.ACCEPTED for d in held)
    assert c.status(p)["confirming"]
    c.sigcont(c[2])
    c.wait_backups_ready(p, ["b1", "b2"])
    for b in c:
        c.wait_depth(b, "q", 100)


def test_the_opt_out_confirms_alone_as_documented(ha_cluster):
    c = ha_cluster(backup_timeout=1.0, ha_extra={"min_confirmations": 1})
    p = c.start_cluster()
    assert c.status(p)["min_confirmations"] == 1
    c.sigstop(c[1])
    c.sigstop(c[2])
    with Client(c.public) as client:
        sent = client.publish("q", [Message(body=i, durable=True) for i in range(20)])
        client.wait(lambda: all(d.settled for d in sent), 10, "confirmation by the primary alone, once its backups "
                                                             "are dropped")
    assert c.status(p)["confirming"]
