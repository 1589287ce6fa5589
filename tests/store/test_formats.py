"""The journal's version and the files beside it (design/data-formats.md): a journal newer than this build reads
is refused, by a broker with its exit code and by `store check`, naming the segment, its version and those this
build reads, and nothing of the data dir changes; `store check` says which versions a journal holds; an HA broker
started over 0.1.0's files upgrades its diverged files (once the cluster enabled their header), and refuses an
epoch file of a newer format."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from harness import run_haqueue
from test_restart import failed_start
from haqueue.formats import EXIT_NEWER_FORMAT, NewerFormat
from haqueue.ha import quarantine
from haqueue.ha.features import FeatureFlags
from haqueue.store import records
from haqueue.store.check import check
from haqueue.store.recovery import read_journal
from haqueue.store.writer import segment_path

TOO_OLD = "this build is older than the one that wrote it; install that release or newer"


def write_segment(directory: Path, number: int, version: int, *body: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = Path(segment_path(str(directory), number))
    header = records.wiring(records.SEGMENT, {"version": version, "segment": number, "created": 1.0e9})
    path.write_bytes(b"".join([header, *body]))
    return path


def queue_q(*seqs: int) -> list[bytes]:
    """Queue q (qid 1) declared and a message at each seq."""
    return [records.wiring(records.QUEUE, {"name": "q", "uid": "uid-q", "args": {}}, qid=1),
            *(records.enqueue(1, seq, 0.0, b"m%d" % seq) for seq in seqs)]


def newer_journal(directory: Path) -> Path:
    """A journal whose newest segment a later release started (version 3), cut short in its last record; that
    segment's path."""
    write_segment(directory, 1, records.VERSION, *queue_q(1, 2))
    return write_segment(directory, 2, 3, *queue_q(3), records.enqueue(1, 4, 0.0, b"m4")[:-1])


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def refused(path: Path, version: int, readable: str) -> str:
    return f"{path}: format {version} is newer than this build reads ({readable}): {TOO_OLD}"


def test_a_newer_journal_is_refused_before_anything_is_read_or_repaired(tmp_path: Path) -> None:
    newest = newer_journal(tmp_path)
    before = files_of(tmp_path)
    with pytest.raises(NewerFormat) as raised:
        read_journal(str(tmp_path), repair=True)  # at start-up: a torn tail of a readable journal is cut off
    assert str(raised.value) == refused(newest, 3, "1-2")
    assert files_of(tmp_path) == before


def test_store_check_says_which_versions_the_journal_holds(tmp_path: Path, capsys) -> None:
    """A broker upgraded over its version 1 journal writes its new segments in version 2."""
    d_record = records._frame(bytes([records.DEQUEUE]) + struct.pack(">IQ", 1, 1))
    write_segment(tmp_path / "journal", 1, 1, *queue_q(1, 2), d_record)
    write_segment(tmp_path / "journal", 2, 2, *queue_q(3))
    assert check(str(tmp_path)) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["versions"], shown["queues"]) == ([1, 2], {"q": 2})


def test_a_broker_refuses_a_newer_journal_with_its_exit_code_and_leaves_it_as_it_was(broker_factory) -> None:
    b = broker_factory(start=False)
    data_dir = Path(b.config["data_dir"])
    newest = newer_journal(data_dir / "journal")
    before = files_of(data_dir)
    assert failed_start(b) == EXIT_NEWER_FORMAT
    assert b.log().splitlines()[-1] == f"haqueue: {refused(newest, 3, '1-2')}"
    assert files_of(data_dir) == before
    checked = run_haqueue(["store", "check", str(data_dir)])
    assert (checked.returncode, checked.stderr.splitlines()[-1]) == (EXIT_NEWER_FORMAT,
                                                                      f"haqueue: {refused(newest, 3, '1-2')}")


def test_an_ha_broker_upgrades_0_1_0s_diverged_files_and_refuses_a_newer_epoch_file(ha_cluster) -> None:
    """b0 starts over 0.1.0's files in a cluster that has enabled diverged file headers (design/upgrades.md)."""
    c = ha_cluster(size=2)
    upgraded, refusing = c[0], c[1]
    data_dir = Path(upgraded.config["data_dir"])
    (data_dir / quarantine.DIRECTORY).mkdir(parents=True)
    FeatureFlags(str(data_dir)).set({quarantine.HEADER_FEATURE})
    (data_dir / "ha-epoch.json").write_text(json.dumps({"epoch": 1, "had_primary": True, "held": 1, "standing": 0,
                                                        "led": [1]}))  # 0.1.0's: no format
    old = {}
    for name, seqs in (("20261128T100000Z-2-q.diverged", (1, 2)), ("20261128T100001Z-1-r.diverged", (3,))):
        path = data_dir / quarantine.DIRECTORY / name  # as 0.1.0 wrote them: records from the first byte
        old[path] = b"".join(struct.pack(">QI", seq, 2) + b"m%d" % seq for seq in seqs)
        path.write_bytes(old[path])
    c.start(0)
    assert c.status(upgraded)["diverged"] == {"kept_since_start": 0, "files": 2, "messages": 3}
    assert {path: path.read_bytes() for path in old} == {path: quarantine.HEADER + data for path, data in old.items()}
    listed = run_haqueue(["diverged", "list", str(data_dir)])
    assert [(row["queue"], row["seqs"]) for row in map(json.loads, listed.stdout.splitlines())] == [
        ("q", [1, 2]), ("r", [3, 3])]

    epoch_file = Path(refusing.config["data_dir"]) / "ha-epoch.json"
    epoch_file.parent.mkdir(parents=True)
    epoch_file.write_text(json.dumps({"format": 2, "epoch": 3}))
    assert failed_start(refusing) == EXIT_NEWER_FORMAT
    assert refusing.log().splitlines()[-1] == f"haqueue: {refused(epoch_file, 2, '1')}"
