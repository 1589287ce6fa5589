"""`python -m haqueue admin -b HOST:PORT ...` against a running broker."""
from __future__ import annotations

import base64
import json
import threading

import pytest
from proton import Message
from proton.reactor import Container

from clients import Client
from harness import free_port, run_haqueue
from haqueue import __version__

pytestmark = pytest.mark.timeout(90)


def admin(broker, *args: str, timeout: float = 30):
    address = broker if isinstance(broker, str) else broker.address
    return run_haqueue(["admin", "-b", address, *args], timeout=timeout)


def json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_status_json(broker):
    with Client(broker):  # one connection besides the admin's own
        p = admin(broker, "status")
    assert p.returncode == 0, p.stderr
    status = json.loads(p.stdout)
    for key in ("name", "role", "state", "queues", "connections"):
        assert key in status, (key, status)
    assert status["name"] == broker.name
    assert status["role"] == "standalone"
    assert status["state"] == "active"
    assert status["version"] == __version__


def test_queue_add_list_del(broker):
    p = admin(broker, "queue", "add", "cli.q", "--arg", "max_depth=5")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["name"] == "cli.q"
    with Client(broker) as c:
        c.send("cli.q", ["one"])
    p = admin(broker, "queue", "list")
    assert p.returncode == 0, p.stderr
    queues = {q["name"]: q for q in json_lines(p.stdout)}
    assert queues["cli.q"]["depth"] == 1
    assert queues["cli.q"]["args"].get("max_depth") == 5
    p = admin(broker, "queue", "del", "cli.q")
    assert p.returncode == 0, p.stderr
    names = [q["name"] for q in json_lines(admin(broker, "queue", "list").stdout)]
    assert "cli.q" not in names


def test_exchange_add_del_and_bindings(broker):
    assert admin(broker, "queue", "add", "cli.bq").returncode == 0
    p = admin(broker, "exchange", "add", "cli.x", "--type", "topic")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["type"] == "topic"
    p = admin(broker, "bind", "cli.x", "cli.bq", "--key", "a.#")
    assert p.returncode == 0, p.stderr
    with Client(broker) as c:
        c.send("cli.x", [Message(subject="a.b.c", body="routed")])
        assert c.queue_depth("cli.bq") == 1
        p = admin(broker, "unbind", "cli.x", "cli.bq", "--key", "a.#")
        assert p.returncode == 0, p.stderr
        c.send("cli.x", [Message(subject="a.b.c", body="dropped")])
        assert c.queue_depth("cli.bq") == 1
    p = admin(broker, "exchange", "del", "cli.x")
    assert p.returncode == 0, p.stderr
    with Client(broker) as c:
        assert c.mgmt("READ", "exchange", "cli.x", expect=None).status == 404


def test_queue_peek_and_purge_leave_what_a_consumer_holds(broker):
    """peek shows the first messages and takes none; purge drops what no consumer holds (the console's actions)."""
    with Client(broker) as c:
        c.send("cli.pq", [Message(body=f"m{i}", properties={"i": i}) for i in range(5)])
        p = admin(broker, "queue", "peek", "cli.pq", "--count", "3")
        assert p.returncode == 0, p.stderr
        peeked = json_lines(p.stdout)
        assert [item["seq"] for item in peeked] == [1, 2, 3] and {item["state"] for item in peeked} == {"available"}
        first = Message()
        first.decode(base64.b64decode(peeked[0]["message"]))
        assert (first.body, first.properties) == ("m0", {"i": 0})
        assert c.queue_depth("cli.pq") == 5
        held = c.conn.create_receiver("cli.pq", credit=1)
        assert held.receive(timeout=5).body == "m0"  # acquired, not settled: the purge leaves it
        p = admin(broker, "queue", "purge", "cli.pq")
        assert (p.returncode, json.loads(p.stdout)) == (0, {"purged": 4}), p.stderr
        assert c.queue_depth("cli.pq") == 1
        assert admin(broker, "queue", "peek", "cli.pq", "--count", "200").returncode == 1  # at most 100


def test_connection_list_and_close(broker):
    with Client(broker, container=Container(container_id="cli-victim")) as victim:
        p = admin(broker, "connection", "list", "--filter", "cli-victim")
        assert p.returncode == 0, p.stderr
        [listed] = json_lines(p.stdout)
        assert listed["container"] == "cli-victim" and listed["user"] == "anonymous", listed
        p = admin(broker, "connection", "close", listed["name"])
        assert p.returncode == 0, p.stderr
        with pytest.raises(Exception, match="forced|closed by an administrator"):
            victim.send("cli.q2", ["after close"])
    p = admin(broker, "connection", "close", "127.0.0.1:1")
    assert p.returncode == 1 and "no connection from '127.0.0.1:1'" in p.stderr, p.stderr


def test_refused_request_exits_1_with_reason(broker):
    p = admin(broker, "queue", "del", "no.such.queue")
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.strip(), "no reason printed"
    assert "no.such.queue" in p.stderr or "not found" in p.stderr.lower(), p.stderr


def test_bad_exchange_type_rejected(broker):
    p = admin(broker, "exchange", "add", "cli.bad", "--type", "bogus")
    assert p.returncode == 2, (p.returncode, p.stderr)  # refused by the CLI's own parser


def test_unreachable_broker_exits_2():
    p = run_haqueue(["admin", "-b", f"127.0.0.1:{free_port()}", "--timeout", "3", "status"], timeout=30)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.strip()


# ---- admin stat ----------------------------------------------------------------------------------

def _publish_steadily(broker, address: str, stop: threading.Event) -> None:
    with Client(broker) as c:
        while not stop.is_set():
            c.send(address, ["tick"])
            stop.wait(0.02)


def _view_rows(view: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in view.splitlines()[2:] if line.strip()}


def test_stat_shows_queues_depths_and_rates(broker):
    with Client(broker) as c:
        c.send("busy", ["x" * 100] * 30)
        c.send("idle", ["y"])
        c.receiver("idle", credit=1)  # a consumer, holding nothing back: the message is delivered to it
        stop = threading.Event()
        pump = threading.Thread(target=_publish_steadily, args=(broker, "busy", stop))
        pump.start()
        try:
            p = admin(broker, "stat", "--interval", "1")
        finally:
            stop.set()
            pump.join(10)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{broker.name}: standalone active"), p.stdout
    assert p.stdout.splitlines()[0].endswith(f", haqueue {__version__}"), p.stdout
    rows = _view_rows(p.stdout)
    assert rows["queue"] == ["queue", "depth", "bytes", "enq/s", "deq/s", "consumers"], p.stdout
    busy, idle = rows["busy"], rows["idle"]
    assert int(busy[1]) > 30 and float(busy[3]) > 5 and float(busy[4]) == 0 and busy[5] == "0", p.stdout
    assert idle[1:] == ["1", idle[2], "0.0", "0.0", "1"], p.stdout
    assert not [name for name in rows if name.startswith("amq.tmp")], p.stdout  # temporary queues left out


def test_stat_watch_refreshes_count_times(broker):
    with Client(broker) as c:
        c.send("w", ["a"])
    p = admin(broker, "stat", "--watch", "--count", "3", "--interval", "0.2")
    assert p.returncode == 0, p.stderr
    views = p.stdout.split(f"{broker.name}: standalone active")[1:]
    assert len(views) == 3 and all("\nw " in v and v.endswith("\n\n") for v in views), p.stdout


def test_stat_refuses_bad_intervals(broker):
    for bad in (["--interval", "0"], ["--interval", "soon"], ["--watch", "--count", "0"]):
        p = admin(broker, "stat", *bad)
        assert p.returncode == 2 and ("--interval" in p.stderr or "--count" in p.stderr), (bad, p.stderr)
