"""The journal's record format (design/store.md): encoding on the broker's thread, reading at recovery.

    magic b"HQ" | length u32 (of type + payload) | crc32 u32 (of type + payload) | type u8 | payload

Message records carry the message's bytes as received, unparsed; wiring records carry JSON.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Final

MAGIC: Final = b"HQ"
_HEAD: Final = struct.Struct(">2sII")  # magic, length, crc
HEAD_SIZE: Final = _HEAD.size
_ENQUEUE: Final = struct.Struct(">BIQd")  # type, qid, seq, expiry (wall clock, 0: never)
_DEQUEUE: Final = struct.Struct(">BIQ")  # a version-1 journal's dequeue: one per message
_DEQUEUES: Final = struct.Struct(">BI")  # type, qid; then (first, last) u64 pairs
_RANGE: Final = struct.Struct(">QQ")
_QID: Final = struct.Struct(">I")
_GROUP: Final = struct.Struct(">BI")
MAX_RECORD: Final = 1 << 31  # a length above this is garbage, not a record

# Record types.
SEGMENT: Final = ord("S")  # payload: JSON {"version", "segment"}; first in every segment
QUEUE: Final = ord("Q")  # payload: qid u32, then JSON {name, uid, args} for Q
QUEUE_DELETED: Final = ord("q")
EXCHANGE: Final = ord("X")  # JSON {name, type, uid, args} / {name, uid}
EXCHANGE_DELETED: Final = ord("x")
BINDING: Final = ord("B")  # JSON {exchange, queue, key, uid, args} / {exchange, queue, key}
UNBOUND: Final = ord("b")
ENQUEUE: Final = ord("E")
DEQUEUE: Final = ord("D")
DEQUEUES: Final = ord("R")  # one queue's dequeues of a loop pass, as seq ranges (version 2)
GROUP: Final = ord("G")  # payload: count u32: the next `count` records are kept whole or not at all (a transaction)

VERSION: Final = 2  # the journal this broker writes (0.1.0 wrote it too)
READABLE: Final = (1, 2)  # version 1 wrote a D record per dequeue


def _frame(body: bytes) -> bytes:
    return _HEAD.pack(MAGIC, len(body), zlib.crc32(body)) + body


def enqueue_head(qid: int, seq: int, expiry: float, data: bytes) -> bytes:
    """An E record up to its message: the journal writes the two one after the other, never joined
    (a copy of every durable message's bytes)."""
    head = _ENQUEUE.pack(ENQUEUE, qid, seq, expiry)
    crc = zlib.crc32(data, zlib.crc32(head))
    return _HEAD.pack(MAGIC, len(head) + len(data), crc) + head


def enqueue(qid: int, seq: int, expiry: float, data: bytes) -> bytes:
    return enqueue_head(qid, seq, expiry, data) + data


ENQUEUE_OVERHEAD: Final = HEAD_SIZE + _ENQUEUE.size


def enqueue_size(data_length: int) -> int:
    """The size of an E record carrying a message of this length."""
    return ENQUEUE_OVERHEAD + data_length


def message_at(record: bytes) -> bytes | None:
    """The message an E record carries, or None if it does not check out (paging reads it back)."""
    found, _ = _check(memoryview(record), 0)
    return found.data if found is not None and found.type == ENQUEUE else None


def dequeues(qid: int, runs: list[tuple[int, int]]) -> bytes:
    """The dequeues of a pass on one queue: (first, last) runs of seqs."""
    pack = _RANGE.pack
    return _frame(b"".join([_DEQUEUES.pack(DEQUEUES, qid), *[pack(first, last) for first, last in runs]]))


def _runs(body: memoryview | bytes, start: int, end: int) -> list[tuple[int, int]]:
    return list(_RANGE.iter_unpack(body[start + _DEQUEUES.size:end]))


def group(count: int) -> bytes:
    """The head of an atomic group; always the same size, so that it can be written before its count is known."""
    return _frame(_GROUP.pack(GROUP, count))


def wiring(kind: int, fields: dict[str, Any], qid: int | None = None) -> bytes:
    prefix = _QID.pack(qid) if qid is not None else b""
    return _frame(bytes((kind,)) + prefix + json.dumps(fields, separators=(",", ":"), default=str).encode())


def queue_deleted(qid: int) -> bytes:
    return _frame(bytes((QUEUE_DELETED,)) + _QID.pack(qid))


def segment_header(number: int, created: float) -> bytes:
    return wiring(SEGMENT, {"version": VERSION, "segment": number, "created": created})


def segment_version(data: bytes) -> Any:
    """The journal version the header at the start of a segment's bytes names; None if they do not start with
    one. Every version keeps this header record as it is: any build can tell a journal newer than it reads."""
    record, _ = _check(memoryview(data), 0)
    if record is None or record.type != SEGMENT or not isinstance(record.fields, dict):
        return None
    return record.fields.get("version")


@dataclass(slots=True)
class Record:
    type: int
    offset: int  # where it starts in its segment
    end: int  # where the next record starts
    qid: int = 0
    seq: int = 0
    expiry: float = 0.0
    data: bytes = b""  # the message (E)
    fields: Any = None  # the JSON payload (wiring)


class Corrupt(Exception):
    """A record that fails its check with valid records after it: never skipped silently."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt record at offset {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


def _decode(body: memoryview, offset: int, end: int) -> Record:
    kind = body[0]
    if kind == ENQUEUE:
        _, qid, seq, expiry = _ENQUEUE.unpack_from(body)
        return Record(kind, offset, end, qid, seq, expiry, data=bytes(body[_ENQUEUE.size:]))
    if kind == DEQUEUE:
        _, qid, seq = _DEQUEUE.unpack_from(body)
        return Record(kind, offset, end, qid, seq)
    if kind == DEQUEUES:
        _, qid = _DEQUEUES.unpack_from(body)
        return Record(kind, offset, end, qid, fields=_runs(body, 0, len(body)))
    if kind == GROUP:
        _, count = _GROUP.unpack_from(body)
        return Record(kind, offset, end, seq=count)
    if kind in (QUEUE, QUEUE_DELETED):
        qid = _QID.unpack_from(body, 1)[0]
        fields = json.loads(bytes(body[5:])) if kind == QUEUE else None
        return Record(kind, offset, end, qid, fields=fields)
    if kind in (SEGMENT, EXCHANGE, EXCHANGE_DELETED, BINDING, UNBOUND):
        return Record(kind, offset, end, fields=json.loads(bytes(body[1:])))
    raise ValueError(f"unknown record type {kind}")


def _check(view: memoryview, pos: int) -> tuple[Record | None, str]:
    """The record at pos, or None and why it is not one."""
    if len(view) - pos < HEAD_SIZE:
        return None, "cut short in its header"
    magic, length, crc = _HEAD.unpack_from(view, pos)
    if magic != MAGIC:
        return None, "no record marker"
    if length == 0 or length > MAX_RECORD:
        return None, f"impossible length {length}"
    end = pos + HEAD_SIZE + length
    if end > len(view):
        return None, f"length {length} runs past the end of the file"
    body = view[pos + HEAD_SIZE:end]
    if zlib.crc32(body) != crc:
        return None, "checksum mismatch"
    try:
        return _decode(body, pos, end), ""
    except (ValueError, struct.error, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        return None, f"undecodable payload ({e})"


def _valid_after(view: memoryview, data: bytes, pos: int) -> int | None:
    """The offset of the first valid record after pos, if any (its marker found, then checked)."""
    start = pos + 1
    while True:
        found = data.find(MAGIC, start)
        if found < 0:
            return None
        if _check(view, found)[0] is not None:
            return found
        start = found + 1


# A message record as read back: (ENQUEUE or DEQUEUE, qid, seq, expiry, message bytes, offset, record
# length). Plain tuples, not Records: recovery reads a million of them, and each object made costs.
MessageRecord = tuple[int, int, int, float, bytes, int, int]


def read_segment(path: str, data: bytes, last: bool,
                 bodies: bool = True) -> tuple[list[Record | MessageRecord], int | None, str]:
    """The records of one segment's bytes, and (offset, reason) of a torn tail to truncate, if any.
    Without `bodies`, message records carry no bytes (a journal larger than memory: read back later).

    A bad record with a valid one after it, or in a segment that is not the last, raises Corrupt: a
    torn write can only be at the end of the newest segment. An atomic group cut short by the end of the
    newest segment is torn off whole."""
    view = memoryview(data)
    found: list[Record | MessageRecord] = []
    group_at, group_left, group_start = 0, 0, 0  # the open group: its offset, records to come, first in found
    pos, n = 0, len(data)
    unpack_head, crc32 = _HEAD.unpack_from, zlib.crc32
    unpack_enqueue, unpack_dequeue, skip = _ENQUEUE.unpack_from, _DEQUEUE.unpack_from, _ENQUEUE.size
    unpack_dequeues = _DEQUEUES.unpack_from
    while pos < n:
        start = pos + HEAD_SIZE
        if start <= n:
            magic, length, crc = unpack_head(data, pos)
            end = start + length
            sound = magic == MAGIC and 0 < length <= MAX_RECORD and end <= n and crc32(view[start:end]) == crc
        else:
            sound = False
        kind = data[start] if sound else 0
        if kind == ENQUEUE:
            _, qid, seq, expiry = unpack_enqueue(data, start)
            found.append((ENQUEUE, qid, seq, expiry, data[start + skip:end] if bodies else b"", pos, end - pos))
        elif kind == DEQUEUES:
            qid = unpack_dequeues(data, start)[1]
            for low, high in _runs(data, start, end):
                found.extend([(DEQUEUE, qid, seq, 0.0, b"", pos, end - pos) for seq in range(low, high + 1)])
        elif kind == DEQUEUE:
            _, qid, seq = unpack_dequeue(data, start)
            found.append((DEQUEUE, qid, seq, 0.0, b"", pos, end - pos))
        else:  # wiring and groups (rare), or a bad record: the careful path says which
            record, reason = _check(view, pos)
            if record is None:
                later = _valid_after(view, data, pos)
                if not last or later is not None:
                    where = f"; a valid record follows at offset {later}" if later is not None else \
                        " in a segment that is not the newest"
                    raise Corrupt(path, pos, reason + where)
                if group_left:
                    del found[group_start:]
                    return found, group_at, f"{reason}, in a transaction's group of records (dropped whole)"
                return found, pos, reason
            end = record.end
            if record.type == GROUP:
                group_at, group_left, group_start = pos, record.seq + 1, len(found)  # + 1: itself, below
            else:
                found.append(record)
        if group_left:
            group_left -= 1
        pos = end
    if group_left:
        if not last:
            raise Corrupt(path, group_at, f"a transaction's group of records lacks {group_left} of them, in a "
                                          f"segment that is not the newest")
        del found[group_start:]
        return found, group_at, f"a transaction's group of records cut short ({group_left} missing; dropped whole)"
    return found, None, ""
