"""The stager hands growing event files to Spark's file source as whole, final files: only whole
lines of a live file, the rest once written; a part its broker has closed whole (a hard link); and
after a restart, what was not staged yet and nothing twice."""
from __future__ import annotations

import os
from pathlib import Path

from harness import run_haqueue
from haqueue.audit.staging import Stager


def staged_text(stager: Stager) -> str:
    """Every staged file's lines, in file-name order (the order of the rounds, per event file)."""
    names = sorted(os.listdir(stager.staged), key=lambda n: (n.split("@")[0], int(n.split("@")[1][:-6])))
    assert not [n for n in names if n.startswith(".")], names
    return "".join(Path(stager.staged, n).read_text() for n in names)


def test_only_whole_lines_of_a_live_file_are_staged_and_the_rest_later(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    live = events / "b0-000001.jsonl"
    live.write_text('{"t": 1}\n{"t": 2}\n{"t": 3')  # the broker is writing the third line
    stager = Stager(str(events), str(tmp_path / "checkpoint"))
    assert stager.stage() == len('{"t": 1}\n{"t": 2}\n')
    assert staged_text(stager) == '{"t": 1}\n{"t": 2}\n'
    assert stager.stage() == 0  # nothing new: no new file
    with open(live, "a") as f:
        f.write('}\n{"t": 4}\n')
    stager.stage()
    assert staged_text(stager) == '{"t": 1}\n{"t": 2}\n{"t": 3}\n{"t": 4}\n'
    assert len(os.listdir(stager.staged)) == 2
    assert stager.last_t == 4


def test_a_closed_part_is_linked_whole_and_a_restart_stages_nothing_twice(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    (events / "b1-000001.jsonl").write_text('{"t": 1}\n{"t": 2, "torn')  # killed mid-line, then restarted
    (events / "b1-000002.jsonl").write_text('{"t": 5}\n')
    checkpoint = str(tmp_path / "checkpoint")
    stager = Stager(str(events), checkpoint)
    stager.stage()
    linked = Path(stager.staged, "b1-000001@0.jsonl")
    assert linked.stat().st_ino == (events / "b1-000001.jsonl").stat().st_ino  # no copy
    with open(events / "b1-000002.jsonl", "a") as f:
        f.write('{"t": 6}\n')
    again = Stager(str(events), checkpoint)  # a restarted watch
    assert again.last_t == 5  # where its end of input goes from
    again.stage()
    assert staged_text(again) == '{"t": 1}\n{"t": 2, "torn{"t": 5}\n{"t": 6}\n'  # the torn line: the reader's


def test_a_crash_between_recording_and_renaming_publishes_what_was_recorded(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    (events / "b0-000001.jsonl").write_text('{"t": 1}\n')
    checkpoint = str(tmp_path / "checkpoint")
    stager = Stager(str(events), checkpoint)
    stager.stage()
    staged = Path(stager.staged, "b0-000001@0.jsonl")
    staged.rename(staged.with_name(".b0-000001@0.jsonl"))  # recorded, not yet renamed
    Path(stager.staged, ".b0-000001@9.jsonl").write_text('{"t": 2}\n')  # written, not recorded
    again = Stager(str(events), checkpoint)
    assert sorted(os.listdir(again.staged)) == ["b0-000001@0.jsonl"]
    assert again.stage() == 0


def test_watch_refuses_a_bound_shorter_than_two_marks_apart(tmp_path):
    result = run_haqueue(["audit", "watch", "--events", str(tmp_path), "--bound", "500ms"])
    assert result.returncode == 2
    assert "--bound must be at least 2s: a backup marks its log once a second" in result.stderr


def test_watch_refuses_events_and_checkpoints_off_the_drivers_file_system(tmp_path):
    """The stager follows the event files and stages them in the checkpoint with the driver's own file
    calls: other schemes are refused before Spark starts; a URI's Parquet output wants a --checkpoint."""
    from audit_command import run_audit_command

    for args, error in [
            (["--events", "hdfs://nn/audit"], "--events of audit watch must be on the driver's file system (a path "
                                              "or file://), where the brokers append to their files: hdfs://nn/audit"),
            (["--events", f"file://{tmp_path}/none"], f"no such directory: file://{tmp_path}/none"),
            (["--events", str(tmp_path), "--parquet", "s3a://bucket/watch"],
             "the checkpoint holds the staged event files and must be on the driver's file system (a path or "
             "file://, shared with the executors): give --checkpoint")]:
        result = run_audit_command(["audit", "watch", *args, "--once"])
        assert (result.returncode, result.stderr.strip()) == (2, f"haqueue audit: {error}")
