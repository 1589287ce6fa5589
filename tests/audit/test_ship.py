"""`haqueue audit ship` (haqueue/audit/ship.py), no Spark: a broker's closed event files reach the destination
each exactly once and whole; the file a writer holds open waits; a ship killed mid-copy (kill -9) leaves
nothing half there and the next run finishes it; a broker killed with kill -9 leaves its last file closed,
and it is shipped; bad input gets one line and its exit code.

To stop a ship mid-copy deterministically, the destination's hidden file it writes (`.<name>.tmp`) is
planted as a named pipe: ship blocks writing into it while the test reads what it sent."""
from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ha_harness import send_all, wait_for
from harness import REPO_ROOT, run_haqueue
from haqueue.audit import parts
from haqueue.audit.writer import Writer

PART_BYTES = 1 << 20  # more than a pipe holds: a ship copying a part into the pipe blocks until it is read


def ship(source: Path, to: Path, *more: str) -> subprocess.CompletedProcess:
    return run_haqueue(["audit", "ship", "--from", str(source), "--to", str(to), "--once", *more])


def write_parts(source: Path, count: int) -> Writer:
    """A writer that filled `count` parts, the last one still open."""
    writer = Writer(str(source), "b0", PART_BYTES)
    line = b'{"t": 1, "event": "mark", "broker": "b0", "role": "primary", "epoch": 1, "run": 1, "n": 1}\n'
    while writer.part < count or writer.size < PART_BYTES // 2:
        writer.write([line * 1000])
    return writer


def shipped(to: Path) -> dict[str, tuple[int, bytes]]:
    """Each file at the destination: its inode and bytes."""
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in sorted(to.iterdir())}


def same_files(source: Path, to: Path, names: list[str]) -> bool:
    return sorted(p.name for p in to.iterdir()) == names and all(
        (to / name).read_bytes() == (source / name).read_bytes() for name in names)


def plant_pipe(to: Path, name: str) -> Path:
    pipe = to / f".{name}.tmp"
    os.mkfifo(pipe)
    return pipe


def start_ship(source: Path, to: Path, *when: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-m", "haqueue", "audit", "ship", "--from", str(source), "--to",
                             str(to), *(when or ["--once"])], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_closed_files_are_shipped_once_and_a_ship_killed_mid_copy_resumes(tmp_path):
    source, to = tmp_path / "events", tmp_path / "shared"
    to.mkdir()
    writer = write_parts(source, 3)
    first = ship(source, to)
    size = sum((source / f"b0~f1-00000{part}.jsonl").stat().st_size for part in (1, 2))
    assert (first.returncode, first.stdout) == (0, f"haqueue audit ship: 2 files ({size / 1e6:.1f} MB) to {to}\n")
    assert same_files(source, to, ["b0~f1-000001.jsonl", "b0~f1-000002.jsonl"])  # the open part waits
    before = shipped(to)
    again = ship(source, to)
    assert (again.returncode, again.stdout, again.stderr) == (0, f"haqueue audit ship: nothing to ship from {source}: "
                                                                 "2 files shipped before, 1 file still open (shipped "
                                                                 "once the broker closes it)\n", "")
    assert shipped(to) == before  # nothing copied twice

    writer.close()  # part 3 is closed: the next ship copies it; kill -9 that ship mid-copy
    pipe = plant_pipe(to, "b0~f1-000003.jsonl")
    killed = start_ship(source, to)
    with open(pipe, "rb") as reader:  # opens once ship is copying part 3 into it
        partial = reader.read(64 << 10)
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
    assert not (to / "b0~f1-000003.jsonl").exists()
    pipe.unlink()
    pipe.write_bytes(partial)  # what a copy killed there leaves on a disk: the first bytes, hidden
    resumed = ship(source, to)
    assert resumed.returncode == 0, resumed.stderr
    # whole; the hidden file gone
    assert same_files(source, to, ["b0~f1-000001.jsonl", "b0~f1-000002.jsonl", "b0~f1-000003.jsonl"])
    assert {name: ino for name, (ino, _) in shipped(to).items() if name in before} == {
        name: ino for name, (ino, _) in before.items()}
    assert ship(source, to).stdout == f"haqueue audit ship: nothing to ship from {source}: 3 files shipped before, " \
                                      "0 files still open (shipped once the broker closes it)\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (ship(empty, to).returncode, ship(empty, to).stdout) == (
        0, f"haqueue audit ship: nothing to ship from {empty}: no event files there (is it the broker's audit.dir?)\n")


def test_a_broker_killed_with_kill_9_leaves_its_last_file_closed_and_it_is_shipped(broker_factory, tmp_path):
    """A running broker's files are shipped once closed by their age (audit.rotate_seconds), never the one it
    writes (it would have grown since, or been the last); its last one once the broker is killed (the kernel
    releases its lock). `--config` finds the broker's audit.dir."""
    events, to = tmp_path / "events", tmp_path / "shared"
    to.mkdir()
    b = broker_factory(audit={"dir": str(events), "rotate_seconds": 1})
    send_all(b.address, "q", range(10))
    wait_for(lambda: len(list(events.glob("*.jsonl"))) >= 2, 10, interval=0.1, message="a part closed by its age")
    running = run_haqueue(["audit", "ship", "--config", str(b.config_path), "--to", str(to), "--once"])
    assert running.returncode == 0, running.stderr
    b.kill()
    written = sorted(p.name for p in events.glob("*.jsonl") if p.stat().st_size)  # one left empty is never shipped
    early = sorted(p.name for p in to.iterdir())
    assert early and early == written[:len(early)] and len(early) < len(written) and same_files(events, to, early)
    running_ship = start_ship(events, to, "--interval", "200ms")  # as a service runs it, until stopped
    wait_for(lambda: same_files(events, to, written), 10, interval=0.1, message="the killed broker's last file shipped")
    running_ship.send_signal(signal.SIGINT)
    out, err = running_ship.communicate(timeout=10)
    assert (running_ship.returncode, err) == (0, ""), err
    assert re.fullmatch(rf"haqueue audit ship: {len(written) - len(early)} files? \([\d.]+ MB\) to {to}\n", out), out
    assert b'"event":"enqueue"' in b"".join((to / name).read_bytes() for name in written)


def test_bad_input_is_one_line_and_its_exit_code(tmp_path):
    """A source or destination that is not there, or a scheme ship does not serve: usage (2). The destination's
    copy vanishing mid-copy (its hidden file removed under it): that file is not shipped (4), and the next
    run ships it."""
    source, to = tmp_path / "events", tmp_path / "shared"
    to.mkdir()
    write_parts(source, 2).close()
    for args, error in [
            (["--from", str(tmp_path / "none"), "--to", str(to)], f"no such directory: {tmp_path}/none"),
            (["--from", str(source), "--to", f"file://{tmp_path}/none"],
             f"cannot reach the destination file://{tmp_path}/none: no such directory (is the share mounted?)"),
            (["--from", str(source), "--to", "s3a://bucket/audit"],
             "cannot ship to s3a://bucket/audit: --to is a directory on a mounted share, a path or a file:// URI "
             "(s3a:// is not supported: ship runs beside a broker without a JVM; mount the store, e.g. through an "
             "NFS gateway, or copy from the shared directory)")]:
        result = run_haqueue(["audit", "ship", *args, "--once"])
        assert (result.returncode, result.stderr) == (2, f"haqueue audit ship: {error}\n")

    pipe = plant_pipe(to, "b0~f1-000001.jsonl")
    failing = start_ship(source, to)
    drained = threading.Event()
    with open(pipe, "rb") as reader:
        pipe.unlink()  # ship still writes into it, and then finds no file to sync and rename
        threading.Thread(target=lambda: (reader.read(), drained.set()), daemon=True).start()
        out, err = failing.communicate(timeout=30)
    assert drained.is_set()
    assert (failing.returncode, err) == (4, f"haqueue audit ship: cannot ship b0~f1-000001.jsonl: [Errno 2] No such "
                                            f"file or directory: '{to}/.b0~f1-000001.jsonl.tmp'\n"), out + err
    assert [p.name for p in to.iterdir()] == ["b0~f1-000002.jsonl"]
    result = ship(source, to)
    assert result.returncode == 0 and same_files(source, to, ["b0~f1-000001.jsonl", "b0~f1-000002.jsonl"])


def test_a_new_file_ship_is_testing_is_left_empty_and_the_writer_never_waits(tmp_path):
    """Ship tests a file's lock at the instant its writer made it: the writer takes the next part instead of
    waiting (the broker's loop never waits for ship); the empty file is never shipped."""
    writer = Writer(str(tmp_path), "b0", PART_BYTES)
    with open(tmp_path / "b0~f1-000001.jsonl", "ab") as tested:
        fcntl.flock(tested.fileno(), fcntl.LOCK_SH)  # as parts.closed holds it, for an instant
        writer.write([b'{"t": 1}\n'])
    assert [(p.name, p.read_bytes()) for p in sorted(tmp_path.iterdir())] == [
        ("b0~f1-000001.jsonl", b""), ("b0~f1-000002.jsonl", b'{"t": 1}\n')]
    assert not parts.closed(str(tmp_path / "b0~f1-000001.jsonl"))
    assert not parts.closed(str(tmp_path / "b0~f1-000002.jsonl"))
    writer.close()
    assert parts.closed(str(tmp_path / "b0~f1-000002.jsonl"))


def test_parquet_ships_each_closed_file_converted_once(tmp_path):
    """`--parquet`: each closed file arrives as NAME.parquet holding its lines (the audit reads it: test_lag), once;
    a ship killed after the rename, before it noted the file, notes it on its next run without writing it again."""
    pq = pytest.importorskip("pyarrow.parquet")
    source, to = tmp_path / "events", tmp_path / "shared"
    to.mkdir()
    writer = write_parts(source, 3)
    first = ship(source, to, "--parquet")
    assert first.returncode == 0 and first.stdout.startswith("haqueue audit ship: 2 files "), first.stderr
    names = ["b0~f1-000001.parquet", "b0~f1-000002.parquet"]  # the open part waits
    assert sorted(p.name for p in to.iterdir()) == names
    for name in names:
        lines = [json.loads(line) for line in (source / name.replace(".parquet", ".jsonl")).read_text().splitlines()]
        rows = pq.read_table(to / name).to_pylist()
        assert [{k: v for k, v in row.items() if v is not None} for row in rows] == lines
    before = shipped(to)
    (state,) = source.glob(".shipped-*")
    state.write_text("".join(state.read_text().splitlines(keepends=True)[:-1]))  # b0~f1-000002 shipped, not noted
    again = ship(source, to, "--parquet")
    size = (source / "b0~f1-000002.jsonl").stat().st_size
    assert (again.returncode, again.stdout, again.stderr) == (0, f"haqueue audit ship: 1 file ({size / 1e6:.1f} MB) "
                                                                 f"to {to}\n", "")
    assert shipped(to) == before  # noted, not written again
    assert ship(source, to, "--parquet").stdout.startswith(f"haqueue audit ship: nothing to ship from {source}: 2 ")
    writer.close()
