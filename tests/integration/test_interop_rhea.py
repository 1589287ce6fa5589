"""Interop with rhea (Node.js): rhea sends -> proton receives, proton sends -> rhea receives,
with header, properties, application properties, annotations and several body kinds compared field
by field. The node scripts live in tests/js/ (send.js, receive.js, typed.js); rhea connects with no
SASL layer, which the broker accepts where anonymous access is allowed (the default)."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from clients import Client
from typed import bare_message, canonical, encode_spec, mismatches

pytestmark = pytest.mark.timeout(90)

JS_DIR = Path(__file__).resolve().parent.parent / "js"
NODE = shutil.which("node")

if NODE is None or not (JS_DIR / "node_modules" / "rhea").is_dir():
    pytest.skip("node or rhea missing (run `npm install` in tests/js)", allow_module_level=True)

T = lambda t, v=None: {"t": t} if t == "null" else {"t": t, "v": v}  # noqa: E731

COMMON = {
    "header": {"durable": True, "priority": 6, "ttl": 600_000, "first_acquirer": False},
    "properties": {"user_id": b"rhea-user".hex(), "subject": "interop", "reply_to": "replies",
                   "correlation_id": T("string", "corr"), "content_type": "application/json",
                   "content_encoding": "utf-8", "absolute_expiry_time": 4102444800000,
                   "creation_time": 1700000000123, "group_id": "g1", "group_sequence": 7,
                   "reply_to_group_id": "rg1"},
    "application_properties": {"s": T("string", "str"), "i": T("int", -5), "l": T("long", 2 ** 40),
                               "u": T("uint", 7), "d": T("double", 0.25), "b": T("bool", True),
                               "n": T("null")},
    "message_annotations": {"x-opt-interop": T("string", "yes")},
}

BODIES = [
    {"section": "value", "v": T("string", "héllo rhea")},
    {"section": "value", "v": T("long", -123456789012)},
    {"section": "value", "v": T("double", 6.5)},
    {"section": "value", "v": T("bool", False)},
    {"section": "value", "v": T("binary", "00010203ff")},
    {"section": "value", "v": T("list", [T("string", "a"), T("int", 1), T("list", [])])},
    {"section": "value", "v": T("map", [[T("string", "k"), T("string", "v")],
                                        [T("string", "n"), T("long", 3)]])},
    {"section": "value", "v": T("array", [T("int", 1), T("int", 2), T("int", 3)])},
    # rhea 3.0.5 cannot write or read a described value as the whole amqp-value (its encoder
    # overwrites the section descriptor), so the described value sits inside a list
    {"section": "value", "v": T("list", [{"t": "described", "d": T("symbol", "org.example:x"),
                                          "v": T("string", "d")},
                                         {"t": "described", "d": T("ulong", 77), "v": T("long", 1)}])},
    {"section": "value", "v": T("uuid", uuid.UUID(int=42).hex)},
    {"section": "value", "v": T("null")},
    {"section": "data", "v": bytes(range(64)).hex()},
    {"section": "sequence", "v": [T("string", "x"), T("long", 2)]},
]


def specs(address: str) -> list[dict]:
    out = []
    for i, body in enumerate(BODIES):
        spec = json.loads(json.dumps(COMMON))
        spec["properties"]["message_id"] = T("string", f"interop-{i}")
        spec["properties"]["to"] = address
        spec["body"] = body
        out.append(spec)
    return out


def node(script: str, payload: dict, timeout: float = 30) -> dict:
    p = subprocess.run([NODE, str(JS_DIR / script)], input=json.dumps(payload), capture_output=True,
                       text=True, timeout=timeout, cwd=JS_DIR)
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"{script} exited {p.returncode}; stdout {p.stdout!r}; stderr {p.stderr!r}")
    out["returncode"] = p.returncode
    out["stderr"] = p.stderr
    return out


def test_rhea_sends_proton_receives(broker):
    address = "interop.rhea-to-proton"
    expected = specs(address)
    out = node("send.js", {"host": broker.host, "port": broker.port, "address": address,
                           "messages": expected, "timeout_ms": 15000})
    assert out["returncode"] == 0, out
    assert [s["state"] for s in out["sent"]] == ["accepted"] * len(expected), out
    with Client(broker) as c:
        got = c.receiver(address).receive_n(len(expected))
    problems = []
    for spec, sent, r in zip(expected, out["sent"], got):
        label = spec["properties"]["message_id"]["v"]
        problems += [f"{label}: {p}" for p in mismatches(spec, canonical(r.message, r.raw))]
        if bare_message(r.raw) != bare_message(base64.b64decode(sent["raw"])):
            problems.append(f"{label}: bare message bytes differ from what rhea encoded")
    assert not problems, "\n".join(problems)


def test_proton_sends_rhea_receives(broker):
    address = "interop.proton-to-rhea"
    expected = specs(address)
    sent = []
    with Client(broker) as c:
        for spec in expected:
            raw = encode_spec(spec)
            sent.append(raw)
            d = c.send_raw(address, raw)
            assert d.remote_state == d.ACCEPTED, d.remote.condition
    out = node("receive.js", {"host": broker.host, "port": broker.port, "address": address,
                              "count": len(expected), "timeout_ms": 15000})
    assert out["returncode"] == 0, out
    assert len(out["received"]) == len(expected)
    problems = []
    for spec, raw, r in zip(expected, sent, out["received"]):
        label = spec["properties"]["message_id"]["v"]
        problems += [f"{label}: {p}" for p in mismatches(spec, r["canonical"])]
        if bare_message(base64.b64decode(r["raw"])) != bare_message(raw):
            problems.append(f"{label}: bare message bytes differ from what proton encoded")
    assert not problems, "\n".join(problems)
    with Client(broker) as c:
        assert c.queue_depth(address) == 0  # rhea accepted them all


def test_rhea_to_rhea_through_exchange(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "exchange", "interop.fan", {"type": "fanout"})
        c.mgmt("CREATE", "queue", "interop.fan.q")
        c.mgmt("CREATE", "binding", body={"exchange": "interop.fan", "queue": "interop.fan.q", "key": ""})
    msgs = [{"properties": {"message_id": T("ulong", i), "subject": "s"},
             "body": {"section": "value", "v": T("string", f"fan-{i}")}} for i in range(20)]
    out = node("send.js", {"host": broker.host, "port": broker.port, "address": "interop.fan",
                           "messages": msgs})
    assert out["returncode"] == 0, out
    out = node("receive.js", {"host": broker.host, "port": broker.port, "address": "interop.fan.q",
                              "count": 20})
    assert out["returncode"] == 0, out
    assert [r["canonical"]["body"]["v"]["v"] for r in out["received"]] == [f"fan-{i}" for i in range(20)]
    assert [r["canonical"]["properties"]["message_id"] for r in out["received"]] == \
        [T("ulong", i) for i in range(20)]


def test_encoders_agree_offline():
    """Check the test's own machinery without a broker: what rhea encodes, proton decodes to the spec."""
    expected = specs("offline")
    out = subprocess.run(
        [NODE, "-e", "const t=require('./typed.js');const rhea=require('rhea');"
                     "const s=JSON.parse(require('fs').readFileSync(0,'utf8'));"
                     "console.log(JSON.stringify(s.map(x=>rhea.message.encode(t.toRhea(x)).toString('base64'))))"],
        input=json.dumps(expected), capture_output=True, text=True, timeout=30, cwd=JS_DIR)
    assert out.returncode == 0, out.stderr
    from proton import Message
    for spec, b64 in zip(expected, json.loads(out.stdout)):
        raw = base64.b64decode(b64)
        m = Message()
        m.decode(raw)
        assert not mismatches(spec, canonical(m, raw)), (spec["body"], mismatches(spec, canonical(m, raw)))
    # and the reverse: what proton encodes, rhea's reader (typed.js) reports as the spec
    raws = [base64.b64encode(encode_spec(s)).decode() for s in expected]
    out = subprocess.run(
        [NODE, "-e", "const t=require('./typed.js');const r=JSON.parse(require('fs').readFileSync(0,'utf8'));"
                     "console.log(JSON.stringify(r.map(b=>t.canonical(Buffer.from(b,'base64')))))"],
        input=json.dumps(raws), capture_output=True, text=True, timeout=30, cwd=JS_DIR)
    assert out.returncode == 0, out.stderr
    for spec, seen in zip(expected, json.loads(out.stdout)):
        assert not mismatches(spec, seen), (spec["body"], mismatches(spec, seen))


def test_rhea_browser_gets_every_message_and_leaves_them(broker):
    """Issue #12, point 1, as rhea's examples write a receiver (auto-accepting), with distribution-mode
    copy: every message, with a credit window or one credit at a time, and none taken off the queue. A link
    that asks for unsettled deliveries (snd-settle-mode unsettled) gets them unsettled: browsing used to send
    pre-settled ones whatever the link asked."""
    from clients import make_messages
    address = "interop.browse"
    with Client(broker) as c:
        c.send(address, make_messages(10, prefix="b"))
    base = {"host": broker.host, "port": broker.port, "address": address, "count": 10,
            "distribution_mode": "copy", "quiet_ms": 200}
    for options in ({}, {"one_at_a_time": True}, {"snd_settle_mode": 0}):
        out = node("receive.js", {**base, **options})
        assert out["returncode"] == 0, (options, out)
        assert [r["canonical"]["body"]["v"]["v"] for r in out["received"]] == [f"b-{i}" for i in range(10)]
        assert out["extra"] == 0, (options, out)
        if options.get("snd_settle_mode") == 0:
            assert not any(r["settled"] for r in out["received"]), out
    with Client(broker) as c:
        assert c.queue_depth(address) == 10


def test_rhea_selector(broker):
    """Issue #12, point 2, with rhea's filter.selector (the numeric descriptor): a consumer gets its matches
    only, the rest stay; the broker echoes the filter; a browser with a selector takes nothing; an invalid
    selector is refused with amqp:invalid-field."""
    from proton import Message
    address = "interop.select"
    with Client(broker) as c:
        c.send(address, [Message(body=f"m-{i}", properties={"colour": "green" if i % 3 else "red", "i": i})
                         for i in range(9)])
    base = {"host": broker.host, "port": broker.port, "address": address, "quiet_ms": 300}
    out = node("receive.js", {**base, "count": 3, "distribution_mode": "copy", "selector": "colour = 'red'"})
    assert out["returncode"] == 0, out
    assert [r["canonical"]["body"]["v"]["v"] for r in out["received"]] == ["m-0", "m-3", "m-6"]
    out = node("receive.js", {**base, "count": 6, "selector": "colour = 'green' AND i BETWEEN 1 AND 8"})
    assert out["returncode"] == 0, out
    assert out["filter"] == {"jms-selector": "colour = 'green' AND i BETWEEN 1 AND 8"}, out
    assert [r["canonical"]["body"]["v"]["v"] for r in out["received"]] == [f"m-{i}" for i in (1, 2, 4, 5, 7, 8)]
    assert out["extra"] == 0, out
    with Client(broker) as c:
        assert c.queue_depth(address) == 3  # the red ones, for someone else
    out = node("receive.js", {**base, "count": 1, "selector": "colour = 'green' AND"})
    assert out["returncode"] == 2 and "amqp:invalid-field" in out["error"], out
    assert "unexpected the end of the selector at position 20" in out["error"], out


def test_rhea_on_a_priority_queue_with_a_scheduled_message(broker):
    """rhea's header priority orders a priority queue, and its delivery-delay annotation holds a message back. The
    hold is ten minutes, so the check does not hang on how soon the receiver starts (with 500 ms, a receiver
    started late on a loaded machine found the held message due and first)."""
    address = "interop.priority"
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", address, {"x-priorities": 10})
    value = lambda n: {"section": "value", "v": T("int", n)}  # noqa: E731
    messages = [{"header": {"priority": 9}, "message_annotations": {"x-opt-delivery-delay": T("long", 600_000)},
                 "body": value(99)}] + [{"header": {"priority": p}, "body": value(p)} for p in (1, 7, 3, 9)]
    sent = node("send.js", {"host": broker.host, "port": broker.port, "address": address, "messages": messages,
                            "timeout_ms": 15000})
    assert sent["returncode"] == 0, sent
    out = node("receive.js", {"host": broker.host, "port": broker.port, "address": address, "count": 4,
                              "timeout_ms": 15000})
    assert out["returncode"] == 0, out
    assert [r["canonical"]["body"]["v"]["v"] for r in out["received"]] == [9, 7, 3, 1]
    with Client(broker) as c:
        assert c.queue_depth(address) == 1  # the held one, not delivered


def test_rhea_resumes_a_durable_subscription(broker):
    """Issue 28: rhea's durable source (durable 2, expiry_policy 'never') with the same container id and link name
    resumes the subscription a proton client made and detached; closing its connection leaves it there."""
    from proton import Message
    from proton.reactor import Container, DurableSubscription
    with Client(broker, container=Container(container_id="rhea-app")) as c:
        c.mgmt("CREATE", "exchange", "news", {"type": "fanout"})
        c.receiver("news", name="feed", options=[DurableSubscription()]).link.detach()
        c.send("news", [Message(body=f"n-{i}", durable=True) for i in range(3)])
        assert c.queue_depth("rhea-app:feed") == 3
    out = node("receive.js", {"host": broker.host, "port": broker.port, "address": "news", "count": 3,
                              "container_id": "rhea-app", "link_name": "feed", "durable": True})
    assert out["returncode"] == 0, out
    assert [r["canonical"]["body"]["v"]["v"] for r in out["received"]] == ["n-0", "n-1", "n-2"]
    with Client(broker) as c:
        c.send("news", ["later"])
        assert c.queue_depth("rhea-app:feed") == 1
