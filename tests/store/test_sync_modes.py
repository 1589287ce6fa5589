"""Sync modes (ha.sync): what a confirmation promises, checked by killing and stopping brokers."""
from __future__ import annotations

import json
import select
import subprocess
import time
from pathlib import Path

import pytest
from proton import Message

from clients import Client
from ha_harness import send_all, split_address
from harness import BrokerProcess, run_haqueue, wait_for

BENCH_JS = Path(__file__).resolve().parents[2] / "bench" / "js"


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
        sent = client.publish("q", [Message(body=i, durable=True) for i in range(200)])
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
        held = client.publish("q", [Message(body=i, durable=True) for i in range(200, 210)])
        client.idle(2.5)  # longer than backup_timeout: b3 is dropped, and a dropped backup is no vote
        assert not any(d.settled for d in held), "confirmed without a majority"
        c.sigcont(c[3])  # b3 comes back, catches up and votes
        client.wait(lambda: all(d.settled for d in held), 15, "confirmation once a majority is back")
        assert all(d.remote_state == d.ACCEPTED for d in held)


@pytest.mark.slow
def test_under_a_flood_healthy_backups_show_their_true_lag_and_are_never_dropped(ha_cluster):
    """Under a flood each backup always has transfers unconfirmed: its `lag_seconds` must still be the
    age of its oldest unconfirmed one (milliseconds here), and a backup that keeps confirming is never dropped for backup_timeout. Counted from a
    confirmed transfer whose delivery address proton had reused, it grew past a second and b1 was
    dropped in each of two runs."""
    c = ha_cluster(size=3, backup_timeout=1.0, ha_extra={"sync": "quorum_disk"})
    p = c.start_cluster()
    host, port = split_address(c.public)
    rate, seconds = 4000, 8
    common = ["--host", host, "--port", str(port), "--address", "flood", "--timeout", "60"]
    consumer = subprocess.Popen(["node", "consumer.js", *common, "--messages", str(rate * seconds)],
                                cwd=BENCH_JS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    producer = None
    try:
        ready, _, _ = select.select([consumer.stdout], [], [], 20)  # its link attached: the queue exists
        assert ready and json.loads(consumer.stdout.readline()) == {"event": "ready"}
        producer = subprocess.Popen(["node", "producer.js", *common, "--rate", str(rate), "--duration",
                                     str(seconds), "--durable"], cwd=BENCH_JS, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        worst: dict[str, float] = {}
        while producer.poll() is None:
            for b in c.status(p)["backups"]:
                worst[b["name"]] = max(worst.get(b["name"], 0.0), b["lag_seconds"])
            time.sleep(0.25)
        sent = json.loads(producer.communicate(timeout=10)[0].splitlines()[-1])
        got = json.loads(consumer.communicate(timeout=60)[0].splitlines()[-1])
    finally:
        for proc in (producer, consumer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sent["ok"] and sent["accepted"] == rate * seconds, sent
    assert got["ok"] and got["received"] == rate * seconds and got["missing"] == 0, got
    backups = {b["name"]: (b["state"], b["timeout_drops"]) for b in c.status(p)["backups"]}
    assert backups == {"b1": ("ready", 0), "b2": ("ready", 0)}, (backups, worst)
    # The wrong count grew with the run, past backup_timeout. The true lag is milliseconds on a quiet machine, and
    # reached 0.71 s with both cores taken by other tests (CI): below backup_timeout, as the backups were kept.
    assert max(worst.values()) < 1.0, worst


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
    assert status["quorum"] == {"needed_backups": 1, "waiting": 0}  # the floor's votes, whatever the mode
    assert (status["min_confirmations"], status["holders"], status["confirming"]) == (2, 3, True)

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
