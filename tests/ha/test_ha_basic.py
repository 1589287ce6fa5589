"""HA in steady state: wiring and messages reach the backups, backups that join late or restart
catch up, client exclusion, selective replication (`x-replicate`), promotion rules, `ha ping`.

Each test runs real broker processes (tests/ha/ha_harness.py) on free loopback ports.
"""
from __future__ import annotations

import json

import pytest
from proton import Message

from ha_harness import (HA_USER, PAIR_GOES_ON, HaCluster, Load, Refused, browse, can_connect, connect,
                        expect_refused_client, receive, send_all, split_address, wait_for)


def backups(c: HaCluster, primary) -> list:
    return [b for b in c.brokers if b is not primary and b.running]


# ---- wiring ----------------------------------------------------------------------------------

def test_wiring_reaches_backups_and_deletes_follow(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "wq", body={"max_depth": 100})
    c.request(p, "CREATE", "exchange", "wx", body={"type": "topic"})
    c.request(p, "CREATE", "binding", body={"exchange": "wx", "queue": "wq", "key": "a.#"})
    for b in backups(c, p):
        wait_for(lambda: "wq" in c.queues(b) and "wx" in c.exchanges(b) and c.bindings(b), 10,
                 message=f"wiring on {b.name}")
        assert c.queues(b)["wq"]["args"]["max_depth"] == 100
        assert c.exchanges(b)["wx"]["type"] == "topic"
        assert [(x["exchange"], x["queue"], x["key"]) for x in c.bindings(b)] == [("wx", "wq", "a.#")]
    # routed through the exchange on the primary, the message reaches the backups' queue
    send_all(c.public, "wx", [Message(subject="a.b", body="routed")])
    for b in backups(c, p):
        c.wait_depth(b, "wq", 1)
        assert c.bodies(b, "wq") == ["routed"]
    # deletes follow
    c.request(p, "DELETE", "binding", body={"exchange": "wx", "queue": "wq", "key": "a.#"})
    for b in backups(c, p):
        wait_for(lambda: not c.bindings(b), 10, message=f"binding gone on {b.name}")
    c.request(p, "DELETE", "exchange", "wx")
    c.request(p, "DELETE", "queue", "wq")
    for b in backups(c, p):
        wait_for(lambda: "wq" not in c.queues(b) and "wx" not in c.exchanges(b), 10,
                 message=f"queue and exchange gone on {b.name}")


# ---- messages and dequeues --------------------------------------------------------------------

def test_messages_and_dequeues_reach_backups(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "mq", range(100))
    got = receive(c.public, "mq", 30)
    assert [m.body for m in got] == list(range(30))
    for b in backups(c, p):
        c.wait_depth(b, "mq", 70)
        assert c.bodies(b, "mq") == list(range(30, 100))
    assert c.depth(p, "mq") == 70



def test_consumed_messages_leave_nothing_for_a_backup_to_redeliver(ha_cluster):
    """A backup notes which messages a consumer holds on the primary (redelivered with delivery-count + 1
    should it be promoted) until their dequeue: once every message is consumed it holds none, though a
    consumer taking one at a time acquires and settles each within one batch of events."""
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "aq", range(300))
    conn = connect(c.public)
    try:
        receiver = conn.create_receiver("aq", credit=1)
        for i in range(300):
            assert receiver.receive(timeout=10).body == i
            receiver.accept()
    finally:
        conn.close()
    for b in backups(c, p):
        c.wait_depth(b, "aq", 0)
        assert c.status(b)["queues"]["aq"]["acquired"] == 0, b.name

def test_a_selector_consumer_leaves_the_backups_consistent(ha_cluster):
    """Backups replicate queues, not consumers: a selector consumer on the primary takes messages out of
    queue order, and every backup drops the same ones (by seq), keeping the rest in order."""
    from proton.reactor import Selector
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "selq", [Message(body=i, durable=True, properties={"colour": "green" if i % 3 else "red"})
                                 for i in range(60)])
    conn = connect(c.public)
    try:
        r = conn.create_receiver("selq", credit=10, options=Selector("colour = 'red'"))
        got = []
        for _ in range(20):
            got.append(r.receive().body)
            r.accept()
    finally:
        conn.close()
    assert got == list(range(0, 60, 3))
    for b in backups(c, p):
        c.wait_depth(b, "selq", 40)
        assert c.bodies(b, "selq") == [i for i in range(60) if i % 3], b.name
    assert [m.body for m in receive(c.public, "selq", 40)] == [i for i in range(60) if i % 3]


def test_messages_of_every_size_reach_backups_whole_and_in_order(ha_cluster):
    """Sent in one go, live enqueues travel many to a transfer (up to 32 KB of messages) and larger
    ones alone: every backup holds the same bodies in the same order."""
    c = ha_cluster()
    p = c.start_cluster()
    sizes = [0, 1, 100, 5_000, 31_000, 40_000, 100, 200_000, 7, 33_000] * 5 + [100] * 500
    bodies = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    send_all(c.public, "sq", [Message(body=body) for body in bodies])
    for b in backups(c, p):
        c.wait_depth(b, "sq", len(bodies))
        assert c.bodies(b, "sq") == bodies, b.name


def test_backup_restart_catches_up(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    b1 = c[1]
    send_all(c.public, "rq", range(50))
    c.wait_depth(b1, "rq", 50)
    b1.stop()
    send_all(c.public, "rq", range(50, 120))   # enqueued while b1 is away
    receive(c.public, "rq", 20)                 # and dequeued while it is away
    b1.start()
    c.wait_ready(b1, queues=["rq"])
    c.wait_backups_ready(p, ["b1", "b2"])
    c.wait_depth(b1, "rq", 100)
    assert c.bodies(b1, "rq") == list(range(20, 120))
    # after the restart, steady state again
    send_all(c.public, "rq", range(120, 130))
    receive(c.public, "rq", 5)
    c.wait_depth(b1, "rq", 105)
    assert c.bodies(b1, "rq") == list(range(25, 130))


def test_backup_started_mid_stream_ends_with_all_messages(ha_cluster):
    c = ha_cluster()
    c.start(0, 1)
    p = c[0]
    c.promote(p)
    c.wait_ready(c[1])
    load = Load(c.public, "ms")
    load._stop_consumer.set()           # producer only: every message stays on the queue
    load.threads[0].start()
    wait_for(lambda: load.confirmed_count() >= 200, 20, message="200 confirmed before b2 starts")
    c.start(2)
    wait_for(lambda: (c.try_status(c[2]) or {}).get("state") in ("catchup", "ready"), 15,
             message="b2 joined")
    base = load.confirmed_count()
    wait_for(lambda: load.confirmed_count() >= base + 200, 20, message="200 more confirmed while b2 joins")
    load.stop_producer()
    assert not load.errors, load.errors[:5]
    n = load.confirmed_count()
    for b in (c[1], c[2]):
        c.wait_ready(b, queues=["ms"])
        c.wait_depth(b, "ms", n)
        assert c.bodies(b, "ms", n) == list(range(n)), f"content on {b.name}"


def test_1000_sent_990_received_leaves_last_10_on_both_backups(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "q1k", range(1000))
    got = receive(c.public, "q1k", 990)
    assert [m.body for m in got] == list(range(990))
    last10 = list(range(990, 1000))
    for b in (c[1], c[2]):
        c.wait_depth(b, "q1k", 10)
        assert c.bodies(b, "q1k") == last10
    # promote each backup in turn and read the queue through the public address
    c.kill(p)
    c.promote(c[1])
    c.wait_state(c[1], "primary", "active", timeout=10)
    browsed = browse(c.public, "q1k", 10)
    assert [m.body for m in browsed] == last10
    c.wait_ready(c[2], queues=["q1k"])
    c.wait_backups_ready(c[1], ["b2"])
    c.kill(c[1])
    c.promote(c[2])
    assert [m.body for m in receive(c.public, "q1k", 10)] == last10
    assert c.depth(c[2], "q1k") == 0


# ---- client exclusion -------------------------------------------------------------------------

def test_backup_refuses_client_and_admits_admin(ha_cluster):
    c = ha_cluster(size=2)
    p = c.start_cluster()
    b = c[1]
    reason = expect_refused_client(b.address)
    assert "forced" in reason and "is a backup" in reason, reason  # naming the primary (test_ha_redirect.py)
    wait_for(lambda: "refused client" in b.log(), 5, message="refusal logged on the backup")
    # the ha user is admitted: status, and the admin CLI
    assert c.status(b)["role"] == "backup"
    r = c.cli(b, "ha", "status")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["role"] == "backup"
    r = c.cli(b, "queue", "list")
    assert r.returncode == 0, r.stderr
    # the primary serves anonymous clients on the public address (and on its own)
    send_all(c.public, "ok", ["x"])
    assert can_connect(*split_address(c.public))


def test_an_admin_connection_made_before_a_backup_follows_a_primary_outlives_the_primarys_snapshot(ha_cluster):
    """The OCF agent's monitor may ask a broker that has just started, before it follows a primary: the primary's
    wiring snapshot makes the replicated queues equal to its own, and leaves the reply queue of that connection
    (a temporary queue, the backup's own) alone. It was deleted, the monitor's link closed, and Pacemaker took
    the broker for failed and restarted it (a failed action in tests/pacemaker's pcs move-and-ban)."""
    c = ha_cluster(size=2)
    c.start()
    b = c[1]
    with c.admin(b, user=HA_USER) as client:
        code, _, joining = client.request("READ", "ha")
        assert code == 200 and joining["state"] != "ready", joining
        c.promote(c[0])
        c.wait_ready(b)
        code, description, ready = client.request("READ", "ha")
        assert code == 200, description
        assert ready["state"] == "ready" and ready["primary"] == c[0].name, ready


def test_ha_ping(ha_cluster):
    c = ha_cluster(size=2)
    c.start_cluster()
    b = c[1]
    r = c.cli(b, "ha", "ping", "--timeout", "2")
    assert r.returncode == 0, r.stderr
    c.sigstop(b)
    r = c.cli(b, "ha", "ping", "--timeout", "1", timeout=20)
    assert r.returncode != 0
    assert "within 1 s" in r.stderr, r.stderr  # gave up on the timeout it was given (how fast: not a test's to say)
    c.sigcont(b)
    r = c.cli(b, "ha", "ping", "--timeout", "2")
    assert r.returncode == 0, r.stderr


# ---- selective replication --------------------------------------------------------------------

def test_x_replicate_values(ha_cluster):
    c = ha_cluster(size=2)
    p = c.start_cluster()
    b = c[1]
    for name, value in (("qn", "none"), ("qc", "configuration"), ("qa", "all"), ("qd", None)):
        c.request(p, "CREATE", "queue", name, body={} if value is None else {"x-replicate": value})
        send_all(c.public, name, range(5))
    c.request(p, "CREATE", "exchange", "xn", body={"type": "direct", "x-replicate": "none"})
    c.request(p, "CREATE", "exchange", "xc", body={"type": "fanout", "x-replicate": "configuration"})
    c.wait_depth(b, "qa", 5)
    c.wait_depth(b, "qd", 5)     # the default is all
    c.wait_ready(b, queues=["qa", "qd"])
    queues = c.queues(b)
    assert "qn" not in queues
    assert queues["qc"]["depth"] == 0
    exchanges = c.exchanges(b)
    assert "xn" not in exchanges and "xc" in exchanges
    # later messages: configuration-only still holds none on the backup
    send_all(c.public, "qc", range(5))
    send_all(c.public, "qa", range(5, 10))
    c.wait_depth(b, "qa", 10)
    assert c.depth(b, "qc") == 0
    assert set(c.status(b)["queues"]) == {"qa", "qd"}


def test_broker_default_replicate_configuration(ha_cluster):
    c = ha_cluster(size=2, replicate="configuration")
    p = c.start_cluster()
    b = c[1]
    c.request(p, "CREATE", "queue", "dflt")
    c.request(p, "CREATE", "queue", "all", body={"x-replicate": "all"})
    send_all(c.public, "dflt", range(3))
    send_all(c.public, "all", range(3))
    c.wait_depth(b, "all", 3)
    wait_for(lambda: "dflt" in c.queues(b), 10, message="dflt declared on the backup")
    assert c.depth(b, "dflt") == 0


def test_broker_default_replicate_none(ha_cluster):
    c = ha_cluster(size=2, replicate="none")
    p = c.start_cluster()
    b = c[1]
    c.request(p, "CREATE", "queue", "dflt")
    c.request(p, "CREATE", "queue", "all", body={"x-replicate": "all"})
    send_all(c.public, "all", range(3))
    c.wait_depth(b, "all", 3)
    assert "dflt" not in c.queues(b)


def test_binding_with_replicate_none_absent_after_failover(ha_cluster):
    c = ha_cluster(size=2, ha_extra=PAIR_GOES_ON)
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "bq")
    c.request(p, "CREATE", "exchange", "bx", body={"type": "direct"})
    c.request(p, "CREATE", "binding", body={"exchange": "bx", "queue": "bq", "key": "kept"})
    c.request(p, "CREATE", "binding", body={"exchange": "bx", "queue": "bq", "key": "local",
                                            "x-replicate": "none"})
    wait_for(lambda: c.bindings(c[1]), 10, message="binding on the backup")
    # a later, replicated binding shows that the wiring stream has passed the local one
    c.request(p, "CREATE", "binding", body={"exchange": "bx", "queue": "bq", "key": "kept2"})
    wait_for(lambda: len(c.bindings(c[1])) >= 2, 10, message="second binding on the backup")
    assert sorted(x["key"] for x in c.bindings(c[1])) == ["kept", "kept2"]
    c.wait_ready(c[1])
    c.kill(p)
    c.promote(c[1])
    assert sorted(x["key"] for x in c.bindings(c[1])) == ["kept", "kept2"]
    # routing by the missing binding's key reaches nothing; by the kept key, the queue
    send_all(c.public, "bx", [Message(subject="kept", body=1)])
    assert c.depth(c[1], "bq") == 1


def test_invalid_x_replicate_refused(ha_cluster):
    c = ha_cluster(size=2)
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "good")
    c.request(p, "CREATE", "exchange", "goodx", body={"type": "direct"})
    attempts = {
        "queue": lambda: c.request(p, "CREATE", "queue", "bad", body={"x-replicate": "sometimes"}),
        "exchange": lambda: c.request(p, "CREATE", "exchange", "bad", body={"type": "direct",
                                                                            "x-replicate": "sometimes"}),
        "binding": lambda: c.request(p, "CREATE", "binding", body={"exchange": "goodx", "queue": "good",
                                                                   "key": "k", "x-replicate": "sometimes"}),
    }
    for kind, attempt in attempts.items():
        with pytest.raises(Refused) as e:
            attempt()
        assert e.value.code == 400, kind
        assert e.value.description.endswith(  # names the argument, its levels and the bad value
            "x-replicate must be one of none, configuration, durable, all, got 'sometimes'"), (kind, e.value.description)
    assert "bad" not in c.queues(p) and "bad" not in c.exchanges(p)
    assert not c.bindings(p)
    # the CLI says the same, with exit 1
    r = c.cli(p, "queue", "add", "bad2", "--arg", "x-replicate=sometimes")
    assert r.returncode == 1 and "x-replicate" in r.stderr
    assert "bad2" not in c.queues(p)


# ---- exclusive, auto-delete and temporary queues ------------------------------------------------

def test_exclusive_queue_replicated_and_survives_failover(ha_cluster):
    c = ha_cluster(size=2)
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "excl", body={"exclusive": True})
    send_all(c.public, "excl", range(3))
    c.wait_depth(c[1], "excl", 3)
    assert c.queues(c[1])["excl"]["args"].get("exclusive") is True
    c.wait_ready(c[1], queues=["excl"])
    c.kill(p)
    c.promote(c[1])
    assert [m.body for m in receive(c.public, "excl", 3)] == [0, 1, 2]


def test_auto_delete_queue_deleted_on_backups(ha_cluster):
    c = ha_cluster(size=2)
    p = c.start_cluster()
    c.request(p, "CREATE", "queue", "ad", body={"auto-delete": True})
    wait_for(lambda: "ad" in c.queues(c[1]), 10, message="auto-delete queue on the backup")
    conn = connect(c.public)
    try:
        r = conn.create_receiver("ad", credit=10)
        # a dynamic (temporary) queue is not replicated
        tmp = conn.create_receiver(None, dynamic=True)
        tmp_name = tmp.remote_source.address
        send_all(c.public, "ad", ["x"])
        assert r.receive(timeout=5).body == "x"
        r.accept()
        assert tmp_name in c.queues(p)
        c.wait_ready(c[1], queues=["ad"])
        assert tmp_name not in c.queues(c[1])
        r.close()
    finally:
        conn.close()
    wait_for(lambda: "ad" not in c.queues(p), 10, message="auto-delete queue gone on the primary")
    wait_for(lambda: "ad" not in c.queues(c[1]), 10, message="auto-delete queue gone on the backup")


# ---- promotion ------------------------------------------------------------------------------

def test_new_primary_with_no_queues_goes_active(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    assert c.status(p)["state"] == "active"
    assert c.queues(p) == {} or all(q.startswith("amq.") for q in c.queues(p))
    c.kill(p)
    c.promote(c[1])
    # b2 was ready: the new primary recovers until b2 is ready again, then goes active
    s = c.wait_state(c[1], "primary", "active", timeout=c[1].config["ha"]["backup_timeout"] + 5)
    assert s["epoch"] == 2
    c.wait_ready(c[2])


def test_single_broker_promotes_and_goes_active(ha_cluster):
    c = ha_cluster(size=1)
    c.start()
    s = c.promote(c[0])
    assert s["role"] == "primary"
    c.wait_state(c[0], "primary", "active", timeout=5)
    send_all(c.public, "solo", [1])


def test_catching_up_broker_refuses_promotion_while_ready_backup_exists(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "pq", range(10))
    for b in (c[1], c[2]):
        c.wait_ready(b, queues=["pq"])
    c.kill(c[2])          # b2 has followed a primary: it is no longer brand new
    c.kill(p)             # and the primary is gone: b2 cannot catch up
    c.start(2)
    s = c.wait_state(c[2], "backup")
    assert s["state"] != "ready"
    r = c.cli(c[2], "ha", "promote")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "catching up" in r.stderr, r.stderr
    assert c.status(c[2])["role"] == "backup"
    # the ready backup can be promoted
    r = c.cli(c[1], "ha", "promote")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["role"] == "primary"
    c.wait_ready(c[2], queues=["pq"])
    assert c.bodies(c[2], "pq") == list(range(10))


def test_a_ready_backup_beside_a_serving_primary_is_not_promoted_even_forced(ha_cluster):
    """A second primary is never made: while b1 follows a primary it hears from, `ha promote` is refused with
    or without --force, naming that primary. Once the primary is killed, the same promote at once succeeds (it
    waits for b1 to let go of the dead connection) and b2 follows b1."""
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "rq", range(10))
    for b in (c[1], c[2]):
        c.wait_ready(b, queues=["rq"])
    for force in ((), ("--force",)):
        r = c.cli(c[1], "ha", "promote", *force)
        assert r.returncode == 1, (force, r.returncode, r.stdout, r.stderr)
        assert "b1 cannot be promoted: it follows b0, the primary of epoch 1, which is serving" in r.stderr, r.stderr
        assert "stop or demote b0 first" in r.stderr, r.stderr
    assert [c.status(b)["role"] for b in c.brokers] == ["primary", "backup", "backup"]
    assert c.status(c[1])["state"] == "ready"
    c.kill(p)
    r = c.cli(c[1], "ha", "promote")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["epoch"] == 2
    c.wait_ready(c[2], queues=["rq"])
    assert c.status(c[2])["primary"] == "b1"
    assert c.bodies(c[1], "rq") == list(range(10))


def test_brand_new_broker_refuses_promotion_while_ready_backup_exists(ha_cluster):
    """Design brief §1: only a ready backup can be promoted, except in a brand-new cluster where
    *every* broker is joining. A fresh broker joining a cluster that has a ready backup is not that."""
    c = ha_cluster()
    c.start(0, 1)
    c.promote(c[0])
    send_all(c.public, "nq", range(10))
    c.wait_ready(c[1], queues=["nq"])
    c.kill(c[0])
    c.start(2)            # never saw a primary
    s = c.wait_state(c[2], "backup")
    assert s["state"] == "joining"
    r = c.cli(c[2], "ha", "promote")
    if r.returncode == 0:
        # Show the consequence: the ready backup follows the empty new primary and drops its queue.
        try:
            wait_for(lambda: (c.try_status(c[1]) or {}).get("primary") == "b2", 5, message="b1 follows b2")
            lost = "nq" not in c.queues(c[1])
        except AssertionError:
            lost = False
        pytest.fail(f"brand-new b2 was promoted while b1 is ready (status {r.stdout.strip()}); "
                    f"b1 then followed it and {'DELETED' if lost else 'kept'} queue nq with its 10 messages")
    assert r.returncode == 1
    assert "catching up" in r.stderr
    assert "nq" in c.queues(c[1])


def test_forced_promotion_of_non_ready_broker(ha_cluster):
    c = ha_cluster(size=2, ha_extra=PAIR_GOES_ON)
    c.start(0)
    c.promote(c[0])
    send_all(c.public, "fq", range(5))
    c.wait_state(c[0], "primary", "active")
    c.kill(c[0])
    c.start(1)              # brand new, primary gone
    r = c.cli(c[1], "ha", "promote", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["role"] == "primary"
