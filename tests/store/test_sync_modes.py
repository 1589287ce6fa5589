"""Sync modes (ha.sync): what a confirmation promises, checked by killing and stopping brokers."""
from __future__ import annotations

import json

import pytest
from proton import Message

from clients import Client
from ha_harness import send_all
from harness import BrokerProcess, run_haqueue, wait_for


def _publish(client: Client, queue: str, bodies: range) -> list:
    sender = client.sender(queue)
    return [sender.link.send(Message(body=i, durable=True)) for i in bodies]


@pytest.mark.slow
def test_quorum_disk_confirms_with_a_majority_and_survives_losing_the_primary_and_a_backup(ha_cluster):
    """5 brokers: with two backups hung, a majority (the primary and two backups) still confirms at
    once; then the primary and one of those backups die, and the last of the majority has every
    confirmed message. With three backups hung nothing is confirmed, until one comes back."""
    c = ha_cluster(size=5, backup_timeout=1.0, ha_extra={"sync": "quorum_disk"})
    p = c.start_cluster()
    assert c.status(p)["quorum"] == {"needed_backups": 2, "waiting": 0}
    c.sigstop(c[3])
    c.sigstop(c[4])
    with Client(c.public) as client:
        sent = _publish(client, "q", range(200))
        client.wait(lambda: all(d.settled for d in sent), 0.8, "confirmation by a majority, before "
                                                               "the hung backups are dropped")
        assert all(d.remote_state == d.ACCEPTED for d in sent)
    c.kill(p)
    c.kill(c[1])
    c.sigcont(c[3])
    c.sigcont(c[4])
    c.promote(c[2])  # the one left of the majority, ready since it confirmed
    assert c.bodies(c[2], "q") == list(range(200))

    c.sigstop(c[3])  # now only b4 of the backups answers: no majority (3 of 5 alive would be needed)
    c.wait_ready(c[4], queues=["q"])
    with Client(c.public) as client:
        held = _publish(client, "q", range(200, 210))
        client.idle(2.5)  # longer than backup_timeout: b3 is dropped, and a dropped backup is no vote
        assert not any(d.settled for d in held), "confirmed without a majority"
        c.sigcont(c[3])  # b3 comes back, catches up and votes
        client.wait(lambda: all(d.settled for d in held), 15, "confirmation once a majority is back")
        assert all(d.remote_state == d.ACCEPTED for d in held)


@pytest.mark.slow
def test_all_disk_confirms_only_what_every_backup_has_on_disk(ha_cluster):
    c = ha_cluster(size=3, ha_extra={"sync": "all_disk"})
    p = c.start_cluster()
    assert {b["confirms_from"] for b in c.status(p)["backups"]} == {"disk"}
    send_all(c.public, "q", [Message(body=i, durable=True) for i in range(300)])
    for b in c:  # kill -9 right after the last confirmation: every journal has every message
        c.kill(b)
    for b in c:
        check = run_haqueue(["store", "check", b.config["data_dir"]])
        assert check.returncode == 0, check.stderr
        assert json.loads(check.stdout)["queues"] == {"q": 300}, b.name


@pytest.mark.parametrize("mode", ["all", "quorum_mem"])
def test_status_shows_the_mode_and_what_each_backup_holds_in_memory_and_on_disk(ha_cluster, mode):
    c = ha_cluster(size=3, ha_extra={"sync": mode})
    p = c.start_cluster()
    send_all(c.public, "q", [Message(body=i, durable=i < 20) for i in range(30)])
    status = c.status(p)
    assert status["sync"] == mode
    assert {b["name"]: (b["unconfirmed"], b["confirms_from"]) for b in status["backups"]} == {
        "b1": (0, "memory"), "b2": (0, "memory")}
    assert ("quorum" in status) == (mode == "quorum_mem")

    def holdings() -> dict | None:  # each backup's report (every second): 30 in memory, the 20 durable on disk
        held = {b["name"]: (b["memory"]["messages"], b["disk"]["messages"], b["disk"]["unsynced_bytes"])
                for b in c.status(p)["backups"] if b["memory"] and b["disk"]}
        return held if held == {"b1": (30, 20, 0), "b2": (30, 20, 0)} else None
    wait_for(holdings, 10, message="reports of 30 messages in memory and 20 on disk from each backup")
    backup = next(b for b in c.status(p)["backups"] if b["name"] == "b1")
    assert backup["memory"]["bytes"] > 0 and backup["disk"]["bytes"] > 0 and backup["reported_seconds_ago"] <= 2


def test_a_bad_sync_mode_is_a_config_error(tmp_path):
    b = BrokerProcess(tmp_path / "bad", {"ha": {"brokers": ["127.0.0.1:5999"], "username": "ha", "password": "p",
                                                "sync": "most"}}, name="bad")
    b.start(wait=False)
    try:
        assert b.wait(timeout=15) == 2
    finally:
        b.kill()
    assert "ha.sync: must be all or all_disk or quorum_mem or quorum_disk, got \"most\"" in b.log()
