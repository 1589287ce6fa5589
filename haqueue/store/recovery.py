"""Reading a journal back (design/store.md, Recovery): at start-up, and offline for `haqueue store check`.

Segments are read oldest first; wiring records are applied in order and message records by
"latest update wins" on (queue, seq). The result is an `Image` the store then loads into the
registry.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .. import formats
from . import records
from .records import Corrupt, MessageRecord, Record
from .writer import segment_path

log = logging.getLogger("haqueue.store")

PROGRESS_EVERY = 2.0  # seconds between progress lines of a long recovery
HEADER_BYTES = 4096  # read of each segment to find its header's version (a header takes under 100)

_SEGMENT_NAME = re.compile(r"^(\d{8})\.seg$")


@dataclass
class QueueImage:
    qid: int
    name: str
    uid: str
    args: dict[str, Any]
    # seq -> (message bytes (none if not kept), expiry, segment, offset, record length) of its latest E record
    messages: dict[int, tuple[bytes, float, int, int, int]] = field(default_factory=dict)
    max_seq: int = 0


@dataclass
class Image:
    queues: dict[int, QueueImage] = field(default_factory=dict)  # by qid
    exchanges: dict[str, dict[str, Any]] = field(default_factory=dict)
    bindings: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    segments: dict[int, int] = field(default_factory=dict)  # number -> size in bytes
    versions: dict[int, int] = field(default_factory=dict)  # number -> its journal version, as its header says
    created: dict[int, float] = field(default_factory=dict)  # number -> when it was started (wall clock)
    records: int = 0
    max_qid: int = 0
    torn: list[str] = field(default_factory=list)  # what was (or, offline, would be) truncated

    @property
    def messages(self) -> int:
        return sum(len(q.messages) for q in self.queues.values())


def segment_numbers(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(_SEGMENT_NAME.match, os.listdir(directory)) if m)


def journal_bytes(directory: str) -> int:
    return sum(os.path.getsize(segment_path(directory, n)) for n in segment_numbers(directory))


def read_journal(directory: str, repair: bool, bodies: bool = True) -> Image:
    """The journal's content. `repair`: truncate a torn tail (at start-up); offline checks only report it.
    Without `bodies` messages are located, not kept (a journal larger than memory may hold).
    Raises Corrupt on a bad record that is not a torn tail, and NewerFormat, before reading or repairing
    anything, if a segment is of a version newer than this build reads."""
    image = Image()
    numbers = segment_numbers(directory)
    _check_headers(directory, numbers)
    sizes = [os.path.getsize(segment_path(directory, n)) for n in numbers]
    started = last_said = time.monotonic()
    for i, number in enumerate(numbers):
        if time.monotonic() - last_said >= PROGRESS_EVERY:  # a journal of many GB takes a while: say how far
            last_said = time.monotonic()
            log.info("store %s: recovering: segment %d of %d, %d of %d MB read, %d records, %.0f s so far",
                     directory, i + 1, len(numbers), sum(sizes[:i]) >> 20, sum(sizes) >> 20, image.records,
                     last_said - started)
        path = segment_path(directory, number)
        with open(path, "rb") as f:
            data = f.read()
        found, torn_at, reason = records.read_segment(path, data, last=i == len(numbers) - 1, bodies=bodies)
        if torn_at is not None:
            what = f"{path}: torn record at offset {torn_at} ({reason}): {len(data) - torn_at} bytes cut off"
            image.torn.append(what)
            if repair:
                log.warning("%s; truncating there (a crash during a write; nothing confirmed was in it)", what)
                os.truncate(path, torn_at)
        image.segments[number] = torn_at if torn_at is not None else len(data)
        header = found[0] if found else None
        if header is not None and (not isinstance(header, Record) or header.type != records.SEGMENT):
            raise Corrupt(path, 0, "the segment does not start with its header")
        if header is not None:
            image.versions[number] = _check_version(path, header.fields.get("version"))
            image.created[number] = float(header.fields.get("created", 0.0))
        _apply(image, found, number)
        image.records += len(found)
    return image


def _check_headers(directory: str, numbers: list[int]) -> None:
    """Every segment's version, from its header alone: a newer journal is refused before anything is read or
    repaired. A segment that does not start with a header (a torn first write) is left to read_segment."""
    for number in numbers:
        path = segment_path(directory, number)
        with open(path, "rb") as f:
            version = records.segment_version(f.read(HEADER_BYTES))
        if version is not None:
            _check_version(path, version)


def _check_version(path: str, version: Any) -> int:
    """A segment's version, if this build reads it; NewerFormat for a newer one, Corrupt for an older one."""
    formats.check(path, version, records.VERSION, records.READABLE[0])
    if version not in records.READABLE:
        raise Corrupt(path, 0, f"journal version {version} is not one this broker reads "
                               f"({', '.join(map(str, records.READABLE))})")
    return int(version)


def _apply(image: Image, found: list[Record | MessageRecord], segment: int) -> None:
    queues = image.queues
    for r in found:
        if type(r) is tuple:
            kind, qid, seq, expiry, data, offset, length = r
            queue = queues.get(qid)
            if queue is None:  # a queue deleted since
                continue
            if kind == records.ENQUEUE:
                queue.messages[seq] = (data, expiry, segment, offset, length)
            else:
                queue.messages.pop(seq, None)
            if seq > queue.max_seq:
                queue.max_seq = seq
        else:
            _apply_wiring(image, r)  # type: ignore[arg-type]


def _apply_wiring(image: Image, r: Record) -> None:
    t = r.type
    if t == records.QUEUE:
        f = r.fields
        existing = image.queues.get(r.qid)
        if existing is None or existing.uid != f["uid"]:  # a segment's snapshot re-declares what exists
            image.queues[r.qid] = QueueImage(r.qid, f["name"], f["uid"], f["args"])
        image.max_qid = max(image.max_qid, r.qid)
    elif t == records.QUEUE_DELETED:
        image.queues.pop(r.qid, None)
        image.max_qid = max(image.max_qid, r.qid)
    elif t == records.EXCHANGE:
        image.exchanges[r.fields["name"]] = r.fields
    elif t == records.EXCHANGE_DELETED:
        if image.exchanges.get(r.fields["name"], {}).get("uid") == r.fields["uid"]:
            del image.exchanges[r.fields["name"]]
    elif t == records.BINDING:
        f = r.fields
        image.bindings[(f["exchange"], f["queue"], f["key"])] = f
    elif t == records.UNBOUND:
        f = r.fields
        image.bindings.pop((f["exchange"], f["queue"], f["key"]), None)
