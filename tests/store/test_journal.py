"""The journal's files without a broker: records, torn tails and corruption, the writer's group commit,
and recovery's "latest update wins"."""
from __future__ import annotations

import logging
import threading

import pytest

from haqueue.store import records, recovery
from haqueue.store.recovery import read_journal
from haqueue.store.records import Corrupt
from haqueue.store.writer import Job, Writer, segment_path


def _segment(number: int, *body: bytes) -> list[bytes]:
    return [records.segment_header(number, 1.0e9), *body]


def _write(directory, number: int, chunks: list[bytes]) -> str:
    path = segment_path(str(directory), number)
    with open(path, "wb") as f:
        f.write(b"".join(chunks))
    return path


def _queue(qid: int, name: str = "q") -> bytes:
    return records.wiring(records.QUEUE, {"name": name, "uid": f"uid-{name}", "args": {"max_depth": 5}}, qid=qid)


def test_records_read_back_as_written(tmp_path):
    path = _write(tmp_path, 1, _segment(1, _queue(7), records.enqueue(7, 42, 1234.5, b"\x00Sw\xa1\x02hi"),
                                        records.dequeues(7, [(41, 41)])))
    found, torn, _ = records.read_segment(path, open(path, "rb").read(), last=True)
    assert torn is None
    assert [chr(r.type) for r in found[:2]] == ["S", "Q"]
    assert found[1].qid == 7 and found[1].fields == {"name": "q", "uid": "uid-q", "args": {"max_depth": 5}}
    header_and_queue = found[0].end + (found[1].end - found[1].offset)
    assert found[2] == (records.ENQUEUE, 7, 42, 1234.5, b"\x00Sw\xa1\x02hi", header_and_queue,
                        records.enqueue_size(7))
    assert found[3][:3] == (records.DEQUEUE, 7, 41)


def test_latest_update_wins_and_deleted_queues_lose_their_messages(tmp_path):
    _write(tmp_path, 1, _segment(1, _queue(1, "a"), _queue(2, "b"),
                                 records.enqueue(1, 1, 0, b"one"), records.enqueue(1, 2, 0, b"two"),
                                 records.enqueue(2, 1, 0, b"b-one"), records.enqueue(1, 1, 0, b"one again"),
                                 records.dequeues(1, [(2, 2)])))
    _write(tmp_path, 2, _segment(2, _queue(1, "a"), records.queue_deleted(2), records.enqueue(1, 3, 0, b"three")))
    image = read_journal(str(tmp_path), repair=False)
    assert {q.name for q in image.queues.values()} == {"a"}
    a = image.queues[1]
    assert {seq: m[0] for seq, m in a.messages.items()} == {1: b"one again", 3: b"three"}
    assert {seq: m[2] for seq, m in a.messages.items()} == {1: 1, 3: 2}
    assert a.max_seq == 3 and image.max_qid == 2


def test_a_pass_of_dequeues_is_one_record_of_seq_ranges(tmp_path):
    messages = [records.enqueue(1, seq, 0, b"m%d" % seq) for seq in range(1, 11)]
    _write(tmp_path, 1, _segment(1, _queue(1), *messages, records.dequeues(1, [(2, 4), (6, 6), (8, 10)])))
    image = read_journal(str(tmp_path), repair=False)
    assert sorted(image.queues[1].messages) == [1, 5, 7]


def test_a_version_1_journal_with_a_record_per_dequeue_is_still_read(tmp_path):
    """A broker upgraded over its old journal: version 1 segments, one D record per dequeue."""
    header = records.wiring(records.SEGMENT, {"version": 1, "segment": 1, "created": 1.0e9})
    d_record = records._frame(bytes([records.DEQUEUE]) + (1).to_bytes(4, "big") + (2).to_bytes(8, "big"))
    _write(tmp_path, 1, [header, _queue(1), records.enqueue(1, 1, 0, b"one"), records.enqueue(1, 2, 0, b"two"),
                         d_record])
    image = read_journal(str(tmp_path), repair=False)
    assert {seq: m[0] for seq, m in image.queues[1].messages.items()} == {1: b"one"}


def test_a_journal_of_an_unknown_older_version_is_corrupt_naming_the_versions_read(tmp_path):
    """No release wrote a version 0 (a newer one is refused otherwise: tests/store/test_formats.py)."""
    header = records.wiring(records.SEGMENT, {"version": 0, "segment": 1, "created": 1.0e9})
    _write(tmp_path, 1, [header, _queue(1)])
    with pytest.raises(Corrupt) as raised:
        read_journal(str(tmp_path), repair=False)
    assert "journal version 0 is not one this broker reads (1, 2)" in str(raised.value)


@pytest.mark.parametrize("tail", [b"HQ\x00\x00\x01", records.enqueue(1, 9, 0, b"cut")[:-2], b"\x00" * 300])
def test_a_torn_tail_is_cut_off_at_start_and_reported_offline(tmp_path, tail):
    good = _segment(1, _queue(1), records.enqueue(1, 1, 0, b"kept"))
    path = _write(tmp_path, 1, good + [tail])
    offline = read_journal(str(tmp_path), repair=False)
    assert offline.messages == 1 and len(offline.torn) == 1 and f"offset {len(b''.join(good))}" in offline.torn[0]
    assert len(open(path, "rb").read()) == len(b"".join(good)) + len(tail)  # offline changes nothing
    repaired = read_journal(str(tmp_path), repair=True)
    assert repaired.messages == 1
    assert open(path, "rb").read() == b"".join(good)


def _transaction(*members: bytes) -> list[bytes]:
    return [records.group(len(members)), *members]


@pytest.mark.parametrize("cut", [1, 2, 3], ids=["in-the-head", "after-the-first-record", "in-the-last-record"])
def test_a_transaction_cut_short_is_dropped_whole(tmp_path, cut):
    """A crash while a commit's records were written (its group cut anywhere) loses all of it, never
    part: the messages before it stay, the torn tail starts at the group's head."""
    before = _segment(1, _queue(1), records.enqueue(1, 1, 0, b"kept"))
    txn = _transaction(records.enqueue(1, 2, 0, b"txn-a"), records.dequeues(1, [(1, 1)]), records.enqueue(1, 3, 0, b"txn-b"))
    whole = b"".join(txn)
    ends = {1: 5, 2: len(txn[0]) + len(txn[1]), 3: len(whole) - 3}
    path = _write(tmp_path, 1, before + [whole[:ends[cut]]])
    offline = read_journal(str(tmp_path), repair=False)
    assert {seq: m[0] for seq, m in offline.queues[1].messages.items()} == {1: b"kept"}
    assert f"offset {len(b''.join(before))}" in offline.torn[0], offline.torn
    read_journal(str(tmp_path), repair=True)
    assert open(path, "rb").read() == b"".join(before)


def test_a_whole_transaction_is_applied_with_the_records_after_it(tmp_path):
    txn = _transaction(records.enqueue(1, 2, 0, b"txn-a"), records.dequeues(1, [(1, 1)]), records.enqueue(1, 3, 0, b"txn-b"))
    _write(tmp_path, 1, _segment(1, _queue(1), records.enqueue(1, 1, 0, b"one"), *txn, records.enqueue(1, 4, 0, b"four")))
    image = read_journal(str(tmp_path), repair=False)
    assert not image.torn
    assert {seq: m[0] for seq, m in image.queues[1].messages.items()} == {2: b"txn-a", 3: b"txn-b", 4: b"four"}


def test_a_transaction_cut_short_in_an_older_segment_is_corruption(tmp_path):
    txn = _transaction(records.enqueue(1, 2, 0, b"txn-a"), records.enqueue(1, 3, 0, b"txn-b"))
    _write(tmp_path, 1, _segment(1, _queue(1), *txn[:2]))
    _write(tmp_path, 2, _segment(2, _queue(1), records.enqueue(1, 9, 0, b"later")))
    with pytest.raises(Corrupt) as raised:
        read_journal(str(tmp_path), repair=True)
    assert "transaction's group of records lacks 1" in str(raised.value)


def test_a_bad_record_followed_by_good_ones_is_corruption_naming_file_and_offset(tmp_path):
    chunks = _segment(1, _queue(1), records.enqueue(1, 1, 0, b"first"), records.enqueue(1, 2, 0, b"second"))
    data = bytearray(b"".join(chunks))
    offset = len(chunks[0]) + len(chunks[1])
    data[offset + records.HEAD_SIZE + 20] ^= 0xFF  # a bit flip inside the first message
    path = segment_path(str(tmp_path), 1)
    open(path, "wb").write(bytes(data))
    with pytest.raises(Corrupt) as raised:
        read_journal(str(tmp_path), repair=True)
    assert raised.value.path == path and raised.value.offset == offset
    assert "checksum mismatch" in str(raised.value) and "a valid record follows" in str(raised.value)
    assert open(path, "rb").read() == bytes(data)  # never "repaired" away


def test_a_bad_tail_in_an_older_segment_is_corruption(tmp_path):
    _write(tmp_path, 1, _segment(1, _queue(1), records.enqueue(1, 1, 0, b"x"))[:-1] + [b"HQ\x00"])
    _write(tmp_path, 2, _segment(2, _queue(1)))
    with pytest.raises(Corrupt, match="not the newest"):
        read_journal(str(tmp_path), repair=True)


def test_writer_syncs_jobs_in_order_and_reports_each_once(tmp_path):
    synced: list[Job] = []
    done = threading.Event()
    jobs = [Job(_segment(1), 0, roll=1)] + [Job([records.enqueue(1, i, 0, b"m%d" % i)], 0, done=[i])
                                            for i in range(1, 200)]
    for job in jobs:
        job.size = sum(map(len, job.records))

    def on_synced(batch: list[Job]) -> None:
        synced.extend(batch)
        if len(synced) == len(jobs):
            done.set()

    writer = Writer(str(tmp_path), on_synced)
    for job in jobs:
        writer.submit(job)
    assert done.wait(10)
    writer.close()
    assert synced == jobs
    assert 1 <= writer.syncs <= len(jobs)  # group commit: usually far fewer syncs than jobs
    data = open(segment_path(str(tmp_path), 1), "rb").read()
    assert data == b"".join(r for job in jobs for r in job.records)


def test_a_long_recovery_logs_its_progress(tmp_path, monkeypatch, caplog):
    """Every PROGRESS_EVERY seconds (here: at every segment) a line says how far recovery has read."""
    for number in (1, 2, 3):
        _write(tmp_path, number, _segment(number, _queue(1), records.enqueue(1, number, 0, b"x" * 1000)))
    monkeypatch.setattr(recovery, "PROGRESS_EVERY", 0.0)
    with caplog.at_level(logging.INFO, logger="haqueue.store"):
        image = read_journal(str(tmp_path), repair=False)
    assert image.records == 9
    progress = [r.getMessage() for r in caplog.records if "recovering:" in r.getMessage()]
    assert [line.split("recovering: ")[1].split(",")[0] for line in progress] == \
           ["segment 1 of 3", "segment 2 of 3", "segment 3 of 3"]
    assert ", 3 records," in progress[1] and ", 6 records," in progress[2]
