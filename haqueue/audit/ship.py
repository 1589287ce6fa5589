"""`haqueue audit ship`: copy a broker's closed event files to a place every Spark executor reads, each
exactly once, whole, and resumably (design/audit-events.md, "Getting every node's events to the audit").

It runs beside a broker, on its node, and must stay light: no PySpark, no JVM. A file is
shipped once its writer has closed it (parts.py: the writer's lock is gone, by rotation, exit or kill -9).
The destination is a directory on a mounted share (NFS, CephFS...: a path or `file://`).

Exactly once, whole, resumably:
- a file is written at the destination under a hidden name (`.<name>.tmp`: Spark and the audit skip names
  starting with `.`), synced, then renamed: its name appears only whole. A ship killed mid-copy leaves the
  hidden file, which the next run writes again from the start;
- what was shipped is noted in a small state file next to the source (`.shipped-<key>`, a name a line,
  after the rename), read once at start. Deciding from the state, not from the destination, keeps a round's
  cost to the new files: a broker keeps every file it wrote, and asking a network share about each of
  them every round would cost a round trip each, forever growing. The destination is asked only about a
  file the state does not list: if it is there already (a ship killed between the rename and the note),
  it is noted, not copied again; if a file of that name is there with another size, it is not ours (a
  broker's audit.dir emptied, its part numbers starting again): refused, never overwritten;
- one ship per source and destination: it holds a lock on the state file.

The copy of one file is `Format.write`: a plain copy (JSONL), or with `--parquet` a conversion to Parquet
(columnar.py, pyarrow alone: `parquet()`), which the audit reads with less CPU (no JSON to parse).
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import hashlib
import io
import os
import shutil
import sys
import time
import traceback
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from haqueue.audit import parts
from haqueue.audit.command import duration
from haqueue.audit.exits import EXIT_JOB_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from haqueue.formats import EXIT_NEWER_FORMAT, NewerFormat

DEFAULT_INTERVAL = datetime.timedelta(seconds=10)  # between rounds
_BLOCK = 1 << 20  # bytes copied at a time


@dataclass(frozen=True)
class Format:
    """What a closed event file becomes at the destination."""

    suffix: str  # the shipped file's name is the event file's less its .jsonl, and this
    write: Callable[[str, str], object]  # (the closed event file, the destination's hidden file): write it
    # Whether a file already at the destination (size in bytes) is what this one would have written.
    matches: Callable[[str, int], bool]


def _copy(source: str, target: str) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, _BLOCK)


JSONL = Format(parts.SUFFIX, _copy, lambda source, size: os.path.getsize(source) == size)


def parquet() -> Format:
    """NAME.jsonl shipped as NAME.parquet (columnar.convert); UsageError without pyarrow (the spark extra)."""
    try:
        from haqueue.audit import columnar
    except ImportError as e:
        raise UsageError(f"--parquet needs pyarrow: pip install 'haqueue[spark]' ({e})") from None

    def matches(source: str, size: int) -> bool:
        """A conversion is the same bytes every time: converted again (in memory), it tells."""
        converted = io.BytesIO()
        columnar.convert(source, converted)
        return len(converted.getvalue()) == size

    return Format(parts.PARQUET, columnar.convert, matches)


class ShipFailed(Exception):
    """A file could not be shipped; the message says which and why."""


class Destination:
    """A directory on a mounted share."""

    def __init__(self, location: str) -> None:
        self.uri = location
        path = _local_path(location)
        if not os.path.isdir(path):
            raise UsageError(f"cannot reach the destination {location}: no such directory (is the share mounted?)")
        self.root = os.path.abspath(path)
        # A share unmounted under a running ship leaves its mount point, an empty local directory: files
        # written there would never reach the audit. The directory's device tells.
        self.device = os.stat(self.root).st_dev

    def check(self) -> None:
        try:
            same = os.stat(self.root).st_dev == self.device
        except OSError as e:
            raise ShipFailed(f"cannot reach the destination {self.uri}: {e.strerror}") from None
        if not same:
            raise ShipFailed(f"the destination {self.uri} is on another file system than when ship started "
                             "(the share unmounted?)")

    def size(self, name: str) -> int | None:
        try:
            return os.stat(os.path.join(self.root, name)).st_size
        except FileNotFoundError:
            return None

    def put(self, source: str, name: str, write: Callable[[str, str], object]) -> None:
        """`write` the file `name` from `source` under a hidden name, sync it, and rename it into place."""
        hidden, final = os.path.join(self.root, f".{name}.tmp"), os.path.join(self.root, name)
        try:
            write(source, hidden)
            _sync(hidden, os.O_RDONLY)
            os.rename(hidden, final)
            _sync(self.root, os.O_RDONLY | os.O_DIRECTORY)  # the rename itself, on a local disk
        except BaseException:
            try:
                os.unlink(hidden)
            except OSError:
                pass
            raise


def _local_path(location: str) -> str:
    """The path of a plain path or `file:` URI; UsageError for any other scheme."""
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    if parsed.scheme and "://" in location:
        raise UsageError(f"cannot ship to {location}: --to is a directory on a mounted share, a path or a file:// "
                         f"URI ({parsed.scheme}:// is not supported: ship runs beside a broker without a JVM; mount "
                         "the store, e.g. through an NFS gateway, or copy from the shared directory)")
    return location


def _sync(path: str, flags: int) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Shipped:
    """The event files of one source directory shipped to one destination in one format, in a file next to
    them, locked while a ship runs."""

    def __init__(self, source: str, destination: Destination, form: Format) -> None:
        key = hashlib.sha256(f"{destination.root}\n{form.suffix}".encode()).hexdigest()[:16]
        self.path = os.path.join(source, f".shipped-{key}")
        try:
            self.file: TextIO = open(self.path, "a+", encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot keep the record of what is shipped in {source}: {e.strerror}") from None
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another `audit ship` is shipping {source} to {destination.uri}") from None
        self.file.seek(0)
        text = self.file.read()
        lines = text.splitlines(keepends=True)
        # A torn last line (a machine crash while noting it) names no file: that one is asked of the destination.
        self.names = {line[:-1] for line in lines[1:] if line.endswith("\n") and parts.PART.match(line[:-1])}
        if not lines:
            self.file.write(f"# shipped to {destination.root} as *{form.suffix}\n")
        elif not text.endswith("\n"):
            self.file.write("\n")
        self.file.flush()

    def add(self, name: str) -> None:
        self.file.write(name + "\n")
        self.file.flush()


@dataclass
class Round:
    files: int = 0
    bytes: int = 0
    failures: list[str] = field(default_factory=list)  # one line each
    earlier: int = 0  # event files shipped by an earlier round or run
    open: int = 0  # event files a writer still holds

    def nothing(self) -> str:
        """Why a round that shipped and failed nothing did so."""
        if not self.earlier and not self.open:
            return "no event files there (is it the broker's audit.dir?)"
        return (f"{_files(self.earlier)} shipped before, {_files(self.open)} still open (shipped once the broker "
                "closes it)")


def _files(n: int) -> str:
    return f"{n:,} file{'' if n == 1 else 's'}"


class Ship:
    def __init__(self, source: str, to: str, form: Format = JSONL) -> None:
        if not os.path.isdir(source):
            raise UsageError(f"no such directory: {source}")
        self.source = source
        self.destination = Destination(to)
        self.form = form
        self.shipped = Shipped(source, self.destination, form)

    def round(self) -> Round:
        """Ship every closed event file not shipped yet; each failure is told and left for the next round."""
        done = Round()
        try:
            self.destination.check()
        except ShipFailed as e:
            done.failures.append(str(e))
            return done
        for name in sorted(os.listdir(self.source)):
            if parts.PART.match(name) and name in self.shipped.names:
                done.earlier += 1
            elif parts.PART.match(name):
                path = os.path.join(self.source, name)
                try:
                    if not parts.closed(path):
                        done.open += 1
                        continue
                except FileNotFoundError:
                    done.failures.append(f"{name} vanished from {self.source} before it was shipped")
                    continue
                try:
                    done.bytes += self.ship(path, name)
                    done.files += 1
                except (OSError, ShipFailed) as e:
                    done.failures.append(f"cannot ship {name}: {e}")
        return done

    def ship(self, path: str, name: str) -> int:
        """Ship one closed event file; its size."""
        size = os.path.getsize(path)
        target = name[: -len(parts.SUFFIX)] + self.form.suffix
        there = self.destination.size(target)
        if there is None:
            self.destination.put(path, target, self.form.write)
        elif not self.form.matches(path, there):
            raise ShipFailed(f"another {target} is already at {self.destination.uri} ({there:,} bytes): was the "
                             "broker's audit.dir emptied, its part numbers starting again? Move one of them away")
        self.shipped.add(name)
        return size


# ---- the command -----------------------------------------------------------------------------

def add_ship_arguments(ship: argparse.ArgumentParser) -> None:
    ship.add_argument("--to", metavar="URI", required=True,
                      help="the shared directory every Spark executor reads: a path or file:// URI on a mounted "
                           "share (NFS, CephFS...); it must exist")
    source = ship.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="source", metavar="DIR", help="the broker's audit directory (audit.dir)")
    source.add_argument("--config", metavar="FILE", help="the broker's config file: ship its audit.dir")
    when = ship.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="ship what is closed now and stop")
    when.add_argument("--interval", metavar="DURATION", type=duration, default=DEFAULT_INTERVAL,
                      help=f"time between rounds, until interrupted (default {DEFAULT_INTERVAL.total_seconds():g}s)")
    ship.add_argument("--parquet", action="store_true",
                      help="ship each file converted to Parquet (NAME.parquet), which the audit reads with less CPU than "
                           "JSON lines; needs pyarrow")
    ship.add_argument("--debug", action="store_true", help="on a failure, show the whole traceback")


def run_ship(args: argparse.Namespace) -> int:
    """Exit 0 when every file closed so far is shipped (--once) or when interrupted, a first round that finds
    nothing to ship saying so and why (no event files: not the broker's audit.dir?); 2 on a usage error
    (a missing source, a destination not there); 4 if a file could not be shipped (--once; running, a
    round's failures are told and tried again the next round); EXIT_NEWER_FORMAT if --parquet finds a file of
    a format this build does not read (a copy reads no line: it ships any)."""
    try:
        ship = Ship(args.source or _audit_dir(args.config), args.to, parquet() if args.parquet else JSONL)
        first = True
        while True:
            done = ship.round()
            if done.files:
                print(f"haqueue audit ship: {_files(done.files)} ({done.bytes / 1e6:,.1f} MB) to {args.to}", flush=True)
            elif first and not done.failures:  # later rounds that ship nothing are the usual wait for a rotation
                print(f"haqueue audit ship: nothing to ship from {ship.source}: {done.nothing()}", flush=True)
            first = False
            for failure in done.failures:
                print(f"haqueue audit ship: {failure}", file=sys.stderr, flush=True)
            if args.once:
                return EXIT_JOB_FAILED if done.failures else EXIT_OK
            time.sleep(args.interval.total_seconds())
    except UsageError as e:
        print(f"haqueue audit ship: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NewerFormat as e:  # --parquet: a file whose lines it cannot convert
        print(f"haqueue audit ship: {e}", file=sys.stderr)
        return EXIT_NEWER_FORMAT
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        print(f"haqueue audit ship: {e}", file=sys.stderr)
        return EXIT_JOB_FAILED


def _audit_dir(config_file: str) -> str:
    from haqueue.config import ConfigError, load_config

    try:
        audit = load_config(config_file).audit
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if audit is None:
        raise UsageError(f"{config_file} has no audit section: its broker writes no events")
    return audit.dir
