"""Hands the brokers' event files to Spark's file source while the brokers are still writing them.

Spark's file source reads a file once, when it first lists it, and never looks at it again: a file
still being appended would be read at the length it had then, and its later lines never. A broker
appends to its file until the file reaches `max_bytes` or the process ends (writer.py). So the
stream does not read the brokers' files: each round, a `Stager` puts every file's new whole lines
into a new file of its own in the staging directory, which the stream reads. A staged file is
written under a hidden name and renamed when whole, so Spark never lists half of one. A part that is
already finished when first seen (its broker has a later part) is hard-linked, not copied.

What has been staged is recorded in `offsets.json` beside the staging directory before the round's
files are renamed into it, so a watch restarted on the same checkpoint goes on where it stopped:
a staged file is either renamed and recorded, or (a crash in between) recorded and renamed at the
next start, or neither and staged again.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

from haqueue.audit import parts

_BLOCK = 16 << 20  # bytes copied at a time
END_OF_INPUT = "end-of-input.jsonl"


class Stager:
    def __init__(self, events: str, directory: str) -> None:
        self.events = os.path.abspath(events)
        self.staged = os.path.join(directory, "staged")  # what the file source reads
        self.state = os.path.join(directory, "offsets.json")
        os.makedirs(self.staged, exist_ok=True)
        saved = _load(self.state)
        self.offsets: dict[str, int] = saved.get("offsets", {})  # event file (relative path) -> bytes staged
        self.ended: bool = saved.get("ended", False)  # an end of input was staged (finish)
        self.last_t: int = saved.get("last_t", 0)  # the time of the newest line staged (µs)
        self._publish_committed()

    # -- a round -------------------------------------------------------------------------------
    def stage(self) -> int:
        """Stage every event file's whole lines not staged yet; the number of bytes staged."""
        sizes = dict(self._event_files())
        finished = _finished(sizes)
        made: list[str] = []
        staged = 0
        for name, size in sorted(sizes.items()):
            start = self.offsets.get(name, 0)
            if size > start:
                temp, end = self._take(name, start, size, name in finished)
                if end > start:
                    made.append(temp)
                    staged += end - start
                    self.offsets[name] = end
        if made:
            self._save()
            for temp in made:
                _publish(temp)
        return staged

    def finish(self, margin_us: int) -> None:
        """Stage an end of input: a mark `margin_us` after the newest line, so that the stream's event
        time passes every window and bound and it judges everything staged as final."""
        line = {"t": self.last_t + margin_us, "event": "mark", "broker": "(end of input)", "role": "backup",
                "epoch": 0, "run": 0, "n": 1}
        temp = os.path.join(self.staged, "." + END_OF_INPUT)
        with open(temp, "w", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        self.ended = True
        self._save()
        _publish(temp)

    # -- files ---------------------------------------------------------------------------------
    def _event_files(self) -> Iterator[tuple[str, int]]:
        """Each event file and its size; NewerFormat for one of a format this build does not read."""
        for root, _, names in os.walk(self.events):
            for name in names:
                if name.endswith(".jsonl"):
                    path = os.path.join(root, name)
                    parts.check_format(path)
                    yield os.path.relpath(path, self.events), os.stat(path).st_size

    def _take(self, name: str, start: int, size: int, finished: bool) -> tuple[str, int]:
        """Bytes [start, size) of event file `name` as a hidden staged file (cut after its last whole
        line unless the file is finished: a finished file's torn last line is for the reader to
        count); (the hidden file, the offset staged up to)."""
        source = os.path.join(self.events, name)
        temp = os.path.join(self.staged, f".{_stem(name)}@{start}.jsonl")
        if start == 0 and finished:
            try:
                os.link(source, temp)
                self._note_last_line(temp, size)
                return temp, size
            except OSError:  # another file system, or links not allowed: copy
                pass
        end = start
        with open(source, "rb") as src, open(temp, "wb") as dst:
            src.seek(start)
            whole = start  # the offset after the last newline copied
            while end < size:
                block = src.read(min(_BLOCK, size - end))
                if not block:
                    break
                dst.write(block)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    whole = end + newline + 1
                end += len(block)
            if not finished:
                dst.truncate(whole - start)
                end = whole
        self._note_last_line(temp, end - start)
        return temp, end

    def _note_last_line(self, path: str, length: int) -> None:
        """Keep the time of the file's last line (lines are written about in time order)."""
        if length == 0:
            return
        with open(path, "rb") as f:
            f.seek(max(0, length - 4096))
            lines = f.read(length - f.tell()).rstrip(b"\n").rsplit(b"\n", 1)
        try:
            self.last_t = max(self.last_t, int(json.loads(lines[-1])["t"]))
        except (ValueError, KeyError, TypeError):  # a torn or foreign last line: its file says nothing
            pass

    # -- the record of what is staged ------------------------------------------------------------
    def _save(self) -> None:
        temp = self.state + ".tmp"
        with open(temp, "w", encoding="utf-8") as f:
            json.dump({"offsets": self.offsets, "ended": self.ended, "last_t": self.last_t}, f)
        os.replace(temp, self.state)

    def _publish_committed(self) -> None:
        """After a crash: hidden files the record counts are renamed, the others dropped."""
        for name in os.listdir(self.staged):
            if not name.startswith("."):
                continue
            temp = os.path.join(self.staged, name)
            match = re.fullmatch(r"\.(.+)@(\d+)\.jsonl", name)
            if name == "." + END_OF_INPUT and self.ended:
                _publish(temp)
            elif match and any(_stem(file) == match.group(1) and offset > int(match.group(2))
                               for file, offset in self.offsets.items()):
                _publish(temp)
            else:
                os.unlink(temp)


def _stem(name: str) -> str:
    return name.replace(os.sep, "_")[: -len(".jsonl")]


def _finished(sizes: dict[str, int]) -> set[str]:
    """The parts a later part of the same broker (same directory) follows: their writer closed them."""
    newest: dict[tuple[str, str], int] = {}
    found: dict[str, tuple[str, str, int]] = {}
    for name in sizes:
        match = parts.PART.match(os.path.basename(name))
        if match:
            key = (os.path.dirname(name), match["broker"])
            found[name] = (*key, int(match["part"]))
            newest[key] = max(newest.get(key, 0), int(match["part"]))
    return {name for name, (directory, broker, part) in found.items() if part < newest[(directory, broker)]}


def _publish(temp: str) -> None:
    directory, name = os.path.split(temp)
    os.replace(temp, os.path.join(directory, name[1:]))


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
