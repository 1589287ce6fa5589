"""The event writer without Spark: message ids, line format, rotation, crash safety, the config
section, and a real standalone broker writing its events."""
from __future__ import annotations

import contextlib
import json
import random
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from proton import Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

from haqueue.audit import schema
from haqueue.audit import _lines
from haqueue.audit.lines import Kind, LineFormatter, read_id
from haqueue.audit.message_id import message_id
from haqueue.audit.writer import Writer
from haqueue.audit.events import AuditLog
from haqueue.broker.queue import Queue
from haqueue.cli import main
from haqueue.config import AuditConfig, ConfigError, load_config


def encoded(**fields) -> bytes:
    return bytes(Message(body="hello", **fields).encode())


def read_lines(directory: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()]


def check_schema(event: dict) -> None:
    required = schema.REQUIRED + schema.REQUIRED_FOR[event["event"]]
    assert all(event.get(name) is not None for name in required), event
    assert set(event) <= set(schema.FIELDS), event


def json_message_id(data: bytes) -> bytes:
    """The message_id of data's line, as JSON text."""
    line = lines_of(LineFormatter("b0"), Kind.ENQUEUE, [(0, 1, data)])
    return line[line.index(b'"message_id":') + 13:-2]


@pytest.mark.parametrize("mid, text", [("order-17", "order-17"), (12345, "12345"),
                                        (uuid.UUID(int=7), "00000000-0000-0000-0000-000000000007"),
                                        (b"\x01\xff", "01ff"), (None, None)])
def test_message_id_read_from_the_encoded_message(mid, text):
    for data in (encoded(id=mid, durable=True, ttl=5), encoded(id=mid)):  # with and without a header
        assert json.loads(json_message_id(data)) == text


@pytest.mark.parametrize("mid", ['say "hi"', "back\\slash", "tab\t", "caf\u00e9", "x" * 300, ""])
def test_message_ids_that_need_escaping_are_read_in_full(mid):
    assert json.loads(json_message_id(encoded(id=mid, durable=True))) == mid


MESSAGES = [  # encodings the C reader handles, and some it leaves to the Python one
    encoded(id="order-17", durable=True, correlation_id="c-1"),
    encoded(durable=True, annotations={"x-opt-a": "v" * 300}),  # no properties; map32 annotations
    encoded(id="m-2", instructions={"x-opt-i": 1}, annotations={"x-opt-a": 2}, properties={"k": "v"}),
    encoded(subject="no id"),  # properties without an id
    encoded(id=42, ttl=5), encoded(id=uuid.UUID(int=7)), encoded(id=b"\x01\xff"), encoded(id="x" * 300),
    bytes(Message(body=b"\x00\x53\x73\xc0\x05\x01\xa1\x02hi").encode()),  # a body that looks like properties
]


def test_message_ids_of_cut_and_damaged_messages_agree_with_the_full_reader():
    """The C reader of the usual encodings either gives the id the Python reader gives, or leaves it to it."""
    rng = random.Random(7)
    samples = [data[:end] for data in MESSAGES for end in range(len(data) + 1)]
    for _ in range(20000):
        data = rng.choice(MESSAGES)
        damaged = bytearray(data[:rng.randrange(4, len(data) + 1)])
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        samples.append(bytes(damaged))
    for sample in samples:
        assert json_message_id(sample) == read_id(sample), sample
    assert [json.loads(json_message_id(data)) for data in MESSAGES] == [
        "order-17", None, "m-2", None, "42", "00000000-0000-0000-0000-000000000007", "01ff", "x" * 300, None]


def test_message_id_of_bytes_that_are_not_a_message_is_none():
    assert message_id(b"") is None
    assert message_id(b"\x00\x53\x73\xc0") is None  # cut short inside the properties
    assert message_id(b"\x00\x53\x77\xa1\x02hi") is None  # a body and no properties


def render(groups: list) -> bytes:
    """What the writer thread writes for `groups`."""
    with tempfile.TemporaryFile() as f:
        written = _lines.write(f.fileno(), groups, read_id)
        f.seek(0)
        text = f.read()
    assert written == len(text)
    return text


def lines_of(f: LineFormatter, kind: Kind, records: list, role: str = "primary",
             backups: tuple[str, ...] = ()) -> bytes:
    """The lines of records (time_ns, seq, data[, enqueued]) of one kind."""
    recorder = _lines.Recorder()
    for t, seq, data, *enqueued in records:
        recorder.add(kind.index, seq, data, *(enqueued or [0]), t)
    parts = f.parts(kind, role, 3, 'q"%d', 'uid-q"%d', backups)  # names JSON must escape
    return render([f.group(parts, recorder.take(kind.index))])


def test_lines_follow_the_schema():
    f = LineFormatter('b"1%s', cluster_size=3)
    data, other = encoded(id="m-1"), encoded(id=7)
    text = b"".join([lines_of(f, Kind.ENQUEUE, [(1_500_000_000, 7, data), (1_500_000_999, 8, other)]),
                     lines_of(f, Kind.COMPLETE, [(1_500_100_000, 7, data)], backups=("b2", "b3")),
                     lines_of(f, Kind.DEQUEUE, [(1_700_000_000, 7, data)]),
                     lines_of(f, Kind.LIVE, [(1_600_000_000, 9, data, 1_400_000)], role="backup"),
                     lines_of(f, Kind.CATCHUP, [(1_600_000_000, 10, other)], role="backup"),
                     lines_of(f, Kind.DIVERGED, [(1_800_000_000, 11, data)], role="backup"),
                     f.mark(2_000_000_000, schema.BACKUP, 3)])
    events = [json.loads(line) for line in text.decode().splitlines()]
    for event in events:
        check_schema(event)
    assert [e["event"] for e in events] == ["enqueue", "enqueue", "complete", "dequeue", "replicate", "replicate",
                                            "diverged", "mark"]
    assert [e["n"] for e in events] == list(range(1, 9))
    assert events[0] == {"t": 1_500_000, "event": "enqueue", "broker": 'b"1%s', "role": "primary", "epoch": 3,
                         "run": f.run, "n": 1, "queue": 'q"%d', "uid": 'uid-q"%d', "seq": 7, "message_id": "m-1"}
    assert [e["message_id"] for e in events[:6]] == ["m-1", "7", "m-1", "m-1", "m-1", "7"]
    assert events[2]["backups"] == ["b2", "b3"]
    assert (events[4]["role"], events[4]["mode"], events[4]["enqueued"]) == ("backup", "live", 1_400_000)
    assert (events[5]["mode"], events[5]["enqueued"]) == ("catchup", 0)
    assert events[6] == {"t": 1_800_000, "event": "diverged", "broker": 'b"1%s', "role": "backup", "epoch": 3,
                         "run": f.run, "n": 7, "queue": 'q"%d', "uid": 'uid-q"%d', "seq": 11, "message_id": "m-1"}
    assert events[7]["role"] == "backup" and "seq" not in events[7] and events[7]["cluster_size"] == 3
    assert not any("cluster_size" in e for e in events[:7])  # the marks say it, once a second: no message line


def test_a_message_kept_off_the_backups_is_confirmed_as_not_replicated():
    """HA's selective replication: the audit must count no copy missing, nor the message lost once gone."""
    text = lines_of(LineFormatter("b0"), Kind.KEPT_LOCAL, [(1_500_000_000, 7, encoded(id="m-1"))])
    [event] = [json.loads(line) for line in text.decode().splitlines()]
    check_schema(event)
    assert (event["event"], event["seq"], event["message_id"], event["backups"], event["replicated"]) == \
        ("complete", 7, "m-1", [], False)


def test_a_shard_process_names_its_shard_in_every_line():
    sharded, plain = LineFormatter("n1.s2", 2), LineFormatter("b0")
    for f, shard in ((sharded, {"shard": 2}), (plain, {})):
        text = b"".join([lines_of(f, Kind.ENQUEUE, [(1_500_000_000, 7, encoded(id="m-1"))]),
                         lines_of(f, Kind.LIVE, [(1_600_000_000, 8, encoded(id="m-2"), 1_400_000)], role="backup"),
                         f.mark(2_000_000_000, schema.PRIMARY, 3)])
        events = [json.loads(line) for line in text.decode().splitlines()]
        for event in events:
            check_schema(event)
            assert {key: value for key, value in event.items() if key == "shard"} == shard


def enqueues(f: LineFormatter, first_seq: int, count: int) -> bytes:
    return lines_of(f, Kind.ENQUEUE, [(10**9, seq, encoded(id=f"m-{seq}")) for seq in range(first_seq, first_seq + count)])


def test_files_rotate_by_size_and_a_new_run_starts_a_new_file(tmp_path):
    f = LineFormatter("b0")
    w = Writer(str(tmp_path), "b0", 4096)
    for i in range(10):  # ten batches of about 1.9 kB each
        w.write([enqueues(f, i * 10, 10)])
    w.close()
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == [f"b0~f1-{k:06d}.jsonl" for k in range(1, len(files) + 1)]
    sizes = [p.stat().st_size for p in files]
    assert len(sizes) >= 3 and min(sizes[:-1]) >= 4096 and max(sizes) < 4096 + 2000  # closed past 4096 bytes
    assert [e["seq"] for e in read_lines(tmp_path)] == [i * 10 + j for i in range(10) for j in range(10)]

    w2 = Writer(str(tmp_path), "b0", 4096)
    w2.write([enqueues(f, 1000, 1)])
    w2.close()
    assert sorted(p.name for p in tmp_path.iterdir())[-1] == f"b0~f1-{len(files) + 1:06d}.jsonl"


def test_a_torn_last_line_is_never_followed_by_more_data(tmp_path):
    """What a kill -9 in the middle of a write leaves: the next process writes a new file."""
    f = LineFormatter("b0")
    w = Writer(str(tmp_path), "b0", 1 << 20)
    w.write([enqueues(f, 1, 1)])
    w.close()
    first = tmp_path / "b0~f1-000001.jsonl"
    first.write_bytes(first.read_bytes() + b'{"t":2000000,"event":"enq')  # torn
    w2 = Writer(str(tmp_path), "b0", 1 << 20)
    w2.write([enqueues(f, 2, 1)])
    w2.close()
    assert first.read_bytes().endswith(b'"event":"enq')
    assert [json.loads(line)["seq"] for line in (tmp_path / "b0~f1-000002.jsonl").read_text().splitlines()] == [2]


def test_audit_config_section(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("audit: {dir: /var/log/haqueue-audit, max_bytes: 1048576}\n")
    audit = load_config(str(path)).audit
    assert (audit.dir, audit.max_bytes) == ("/var/log/haqueue-audit", 1048576)
    for text, error in (("audit: {max_bytes: 4096}", "audit.dir: missing"),
                        ("audit: {dir: a, flush_interval: 0.2}", "audit.flush_interval: unknown key"),
                        ("audit: {dir: a, max_bytes: 10}", "audit.max_bytes: must be an integer >= 4096"),
                        ("audit: {dir: a, keep: 3}", "audit.keep: unknown key")):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=error):
            load_config(str(path))


def test_audit_lag_usage_errors(capsys, tmp_path):
    assert main(["audit", "lag", "--events", str(tmp_path), "--out", str(tmp_path), "--since", "yesterday"]) == 2
    assert "expected ISO 8601 or seconds since the epoch" in capsys.readouterr().err
    assert main(["audit", "lag", "--out", str(tmp_path)]) == 2


def test_a_standalone_broker_writes_enqueue_complete_dequeue(broker_factory, tmp_path):
    events = tmp_path / "events"
    b = broker_factory(name="solo", audit={"dir": str(events)})
    conn = BlockingConnection(b.url(), sasl_enabled=False, timeout=10)
    try:
        sender = conn.create_sender("orders")
        for i in range(4):
            sender.send(Message(id=f"order-{i}", body=i))
        conn.create_sender("orders", name="presettled", options=AtMostOnce()).send(Message(id="unconfirmed", body=4))
        receiver = conn.create_receiver("orders", credit=3)
        for _ in range(3):
            receiver.receive(timeout=10)
            receiver.accept()
    finally:
        conn.close()
    b.stop()
    got = read_lines(events)
    for event in got:
        check_schema(event)
    messages = [e for e in got if e["event"] != "mark"]
    assert {(e["event"], e["seq"], e["message_id"]) for e in messages} == {  # a pre-settled message is never confirmed
        *(("enqueue", i + 1, f"order-{i}") for i in range(4)), ("enqueue", 5, "unconfirmed"),
        *(("complete", i + 1, f"order-{i}") for i in range(4)),
        *(("dequeue", i + 1, f"order-{i}") for i in range(3))}
    assert {(e["broker"], e["role"], e["epoch"], e["queue"]) for e in messages} == {("solo", "standalone", 0, "orders")}
    assert got[0]["event"] == "mark" and got[-1]["event"] == "mark"  # the run's start and its clean stop
    assert got[0]["cluster_size"] == 1  # no HA: it confirms alone, as a cluster of one
    assert [e["n"] for e in got] == list(range(1, len(got) + 1))


def test_every_confirmation_a_client_saw_survives_a_kill_9(broker_factory, tmp_path):
    """An event is in its file before the confirmation it records leaves the broker: killing the
    broker (SIGKILL, no chance to write anything more) right after the client's last confirmation
    loses none of them."""
    events = tmp_path / "events"
    b = broker_factory(name="solo", audit={"dir": str(events)})
    conn = BlockingConnection(b.url(), sasl_enabled=False, timeout=10)
    sender = conn.create_sender("orders")
    for i in range(200):
        sender.send(Message(id=f"order-{i}", body=i))  # returns once the broker confirmed it
    b.kill()
    conn.timeout = 0.5
    with contextlib.suppress(Exception):  # the broker is gone: the close ends in an error
        conn.close()
    confirmed = [e["message_id"] for e in read_lines(events) if e["event"] == "complete"]
    assert confirmed == [f"order-{i}" for i in range(200)]


def backup_audit(directory: Path, q: Queue) -> tuple[AuditLog, SimpleNamespace, list]:
    """An AuditLog on stand-ins for a broker holding `q` and its HA, a backup of epoch 1 in a cluster of 3
    (ha.ready: the backups ready for `q` once promoted); (the audit, the HA, the broker's completion hooks)."""
    ha = SimpleNamespace(policy=SimpleNamespace(replicates_messages=lambda queue: True), epoch=SimpleNamespace(epoch=1),
                         primary=None, ready=(), replication_hooks=[], context_hooks=[], promotion_hooks=[],
                         config=SimpleNamespace(brokers=[("127.0.0.1", port) for port in (1, 2, 3)]))
    ha.ready_backups = lambda queue: ha.ready
    completion_hooks: list = []
    broker = SimpleNamespace(name="b1", registry=SimpleNamespace(queues=lambda: [q], queue_hooks=[]),
                             completion_hooks=completion_hooks, flush_hooks=[], engine=SimpleNamespace(every=lambda *a: None))
    return AuditLog(broker, AuditConfig(dir=str(directory)), ha), ha, completion_hooks  # type: ignore[arg-type]


def test_a_backup_logs_each_kind_its_replication_hook_passes(tmp_path):
    """E a live replica, C a caught-up one, D a dequeue the primary sent; V a message kept aside at a rejoin
    (the new primary never had it): its own event, not a dequeue. Marks say the cluster's size."""
    q = Queue("orders", {}, uid="uid-orders", schedule=lambda q: None)
    audit, ha, _ = backup_audit(tmp_path, q)
    for kind, seq in ((b"E", 1), (b"C", 2), (b"D", 1), (b"V", 3)):
        for hook in ha.replication_hooks:
            hook(q, kind, seq, 1_000 if kind == b"E" else 0, encoded(id=f"m-{seq}"))
    audit.close()
    got = read_lines(tmp_path)
    for event in got:
        check_schema(event)
    assert [(e["event"], e.get("mode"), e["seq"], e["message_id"]) for e in got if e["event"] != "mark"] == [
        ("replicate", "live", 1, "m-1"), ("replicate", "catchup", 2, "m-2"), ("dequeue", None, 1, "m-1"),
        ("diverged", None, 3, "m-3")]
    assert {(e["role"], e["cluster_size"]) for e in got if e["event"] == "mark"} == {("backup", 3)}


def test_buffered_events_are_written_under_the_context_they_happened_in(tmp_path):
    """HA's context hooks: replicas recorded as a backup stay backup lines of the old epoch though the
    broker is promoted before the next flush; a confirmation names the backups ready when it happened."""
    q = Queue("orders", {}, uid="uid-orders", schedule=lambda q: None)
    audit, ha, completion_hooks = backup_audit(tmp_path, q)

    def context_changes(change) -> None:  # as HaBroker does it: the hooks first
        for hook in ha.context_hooks:
            hook()
        change()

    def publish(mid: str) -> None:
        entry = q.enqueue(encoded(id=mid), 0.0)
        for hook in completion_hooks:
            hook(q, entry)

    for hook in ha.replication_hooks:
        hook(q, b"E", 7, 1_000, encoded(id="replica"))
    context_changes(lambda: setattr(ha.epoch, "epoch", 2))  # promotion: a newer epoch,
    ha.primary = object()
    for hook in ha.promotion_hooks:  # then the promotion hooks
        hook()
    publish("before-b2")
    context_changes(lambda: setattr(ha, "ready", ("b2",)))  # backup b2 caught up with the queue
    publish("after-b2")
    audit.close()
    events = {(e["event"], e.get("message_id")): e for e in read_lines(tmp_path) if e["event"] != "mark"}
    assert sorted(events) == [("complete", "after-b2"), ("complete", "before-b2"), ("enqueue", "after-b2"),
                              ("enqueue", "before-b2"), ("replicate", "replica")]
    assert (events["replicate", "replica"]["role"], events["replicate", "replica"]["epoch"]) == ("backup", 1)
    assert {(e["role"], e["epoch"]) for e in events.values() if e["event"] != "replicate"} == {("primary", 2)}
    assert events["complete", "before-b2"]["backups"] == [] and events["complete", "after-b2"]["backups"] == ["b2"]
