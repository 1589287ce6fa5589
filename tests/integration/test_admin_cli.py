"""`python -m haqueue admin -b HOST:PORT ...` against a running broker."""
from __future__ import annotations

import json

import pytest
from proton import Message

from clients import Client
from harness import free_port, run_haqueue

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
