"""Each file a broker keeps names its format (design/data-formats.md): 0.1.0's, which name none, are read as
format 1, and upgraded in place where the format changed; a file of a newer format is refused with a message
naming it, its format and those this build reads, never misread. What 0.1.0 does with this build's files is
tried with 0.1.0's own code, from git. The journal's formats: tests/store/test_formats.py."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import types
from pathlib import Path

import pytest

from harness import REPO_ROOT, run_haqueue
from haqueue.audit.staging import Stager
from haqueue.audit.writer import Writer
from haqueue.cli import main
from haqueue.diverged import describe
from haqueue.formats import EXIT_NEWER_FORMAT, NewerFormat
from haqueue.ha import quarantine
from haqueue.ha.features import FeatureFlags
from haqueue.ha.quarantine import Quarantine, file_format, read_messages
from haqueue.ha.role import EpochStore
from releases import V0_1_0

TOO_OLD = "this build is older than the one that wrote it; install that release or newer"


def released(path: str) -> types.ModuleType:
    """The module at `path` as 0.1.0 had it (those used here need the standard library alone)."""
    source = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{V0_1_0.commit}:{path}"], capture_output=True,
                            text=True, check=True).stdout
    module = types.ModuleType(f"released_{Path(path).stem}")
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def refused(path: Path, version: int, readable: str) -> str:
    return f"{path}: format {version} is newer than this build reads ({readable}): {TOO_OLD}"


# ---- ha-epoch.json -------------------------------------------------------------------------------

def test_0_1_0s_epoch_file_is_read_and_reads_this_builds(tmp_path: Path) -> None:
    path = tmp_path / "ha-epoch.json"
    path.write_text(json.dumps({"epoch": 7, "had_primary": True, "held": 6, "standing": 2, "led": [3, 6]}))
    epochs = EpochStore(str(tmp_path))
    assert (epochs.epoch, epochs.held, epochs.standing, epochs.led) == (7, 6, 2, [3, 6])
    epochs.raise_to(8)
    assert json.loads(path.read_text())["format"] == 1
    downgraded = released("haqueue/ha/role.py").EpochStore(str(tmp_path))
    assert (downgraded.epoch, downgraded.held, downgraded.standing, downgraded.led) == (8, 6, 2, [3, 6])


def test_an_epoch_file_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ha-epoch.json"
    path.write_text(json.dumps({"format": 2, "epoch": 7}))
    with pytest.raises(NewerFormat) as raised:
        EpochStore(str(tmp_path))
    assert str(raised.value) == refused(path, 2, "1")



def test_a_features_file_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ha-features.json"
    path.write_text(json.dumps({"format": 2, "enabled": ["something-new"]}))
    with pytest.raises(NewerFormat) as raised:
        FeatureFlags(str(tmp_path))
    assert str(raised.value) == refused(path, 2, "1")


# ---- diverged files ------------------------------------------------------------------------------

def kept_by_0_1_0(data_dir: Path, messages: dict[str, list[tuple[int, bytes]]]) -> dict[Path, bytes]:
    """Diverged files as 0.1.0 wrote them (no header), one per queue: path -> bytes."""
    keeper = released("haqueue/ha/quarantine.py").Quarantine(str(data_dir))
    paths = [keeper.keep(queue, kept) for queue, kept in messages.items()]
    return {path: path.read_bytes() for path in paths}


def enable_headers(data_dir: Path) -> None:
    """The cluster enabled format 2 (design/upgrades.md), as a broker keeps it in its data dir."""
    FeatureFlags(str(data_dir)).set({quarantine.HEADER_FEATURE})


def test_0_1_0s_diverged_files_are_read_and_get_their_header_once_the_cluster_enables_it(tmp_path: Path) -> None:
    old = kept_by_0_1_0(tmp_path, {"orders": [(1, b"a"), (2, b"b")], "a/b": [(5, b"c")]})
    listed = {row["queue"]: (row["messages"], row["seqs"]) for row in describe(str(tmp_path))}
    assert listed == {"orders": (2, [1, 2]), "a/b": (1, [5, 5])}
    Quarantine(str(tmp_path))  # a broker's start, in a cluster that may still go back to 0.1.0
    assert {path: path.read_bytes() for path in old} == old
    enable_headers(tmp_path)
    Quarantine(str(tmp_path))
    assert {path: path.read_bytes() for path in old} == {path: quarantine.HEADER + data for path, data in old.items()}
    assert {row["queue"]: (row["messages"], row["seqs"]) for row in describe(str(tmp_path))} == listed


def test_0_1_0_reads_this_builds_diverged_files_until_the_header_which_stops_it_rather_than_misread(
        tmp_path: Path) -> None:
    previous = released("haqueue/ha/quarantine.py")
    keeper = Quarantine(str(tmp_path))
    plain = keeper.keep("q", [(1, b"m")])
    assert list(previous.read_messages(plain)) == list(read_messages(plain)) == [(1, b"m")]
    enable_headers(tmp_path)
    headed = keeper.keep("r", [(2, b"n")])
    assert (file_format(plain), file_format(headed), list(read_messages(headed))) == (1, 2, [(2, b"n")])
    with pytest.raises(ValueError, match=r"truncated record at byte 0$"):
        list(previous.read_messages(headed))


def test_a_diverged_file_of_a_newer_format_is_refused_by_the_broker_and_the_commands(tmp_path: Path) -> None:
    path = tmp_path / quarantine.DIRECTORY / "20271201T000000Z-1-q.diverged"
    path.parent.mkdir()
    newer = quarantine.MAGIC + struct.pack(">IQI", 3, 1, 1) + b"m"
    path.write_bytes(newer)
    with pytest.raises(NewerFormat) as raised:
        Quarantine(str(tmp_path))  # a broker's start
    assert str(raised.value) == refused(path, 3, "1-2")
    for command in (["list", str(tmp_path)], ["republish", str(tmp_path), "--to", "127.0.0.1:1"]):
        result = run_haqueue(["diverged", *command])
        assert (result.returncode, result.stderr.splitlines()[-1]) == (
            EXIT_NEWER_FORMAT, f"haqueue: {refused(path, 3, '1-2')}"), result.stderr
    assert path.read_bytes() == newer


def test_an_upgrade_cut_short_is_finished_by_the_next_start_with_every_message_once(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """The process dies as it renames the second converted file over the old one: each file is old or new,
    never half, and the next start converts the rest, not the first again."""
    old = kept_by_0_1_0(tmp_path, {f"q{i}": [(10 * i + j, b"m%d" % (10 * i + j)) for j in range(3)]
                                   for i in range(3)})
    enable_headers(tmp_path)
    renamed: list[str] = []
    replace = os.replace

    def dies_at_the_second(source: str, target: str) -> None:
        if renamed:
            raise SystemExit("killed")
        renamed.append(target)
        replace(source, target)

    monkeypatch.setattr(os, "replace", dies_at_the_second)
    with pytest.raises(SystemExit):
        Quarantine(str(tmp_path))
    monkeypatch.undo()
    directory = tmp_path / quarantine.DIRECTORY
    assert sorted(file_format(path) for path in old) == [1, 1, 2]
    assert len(list(directory.glob("*.converting"))) == 1  # the second one's copy, whole but not renamed
    Quarantine(str(tmp_path))
    assert sorted(os.listdir(directory)) == sorted(path.name for path in old)  # no copy left beside them
    for path, data in old.items():
        assert path.read_bytes() == quarantine.HEADER + data
    assert sorted(seq for path in old for seq, _ in read_messages(path)) == [10 * i + j for i in range(3)
                                                                             for j in range(3)]


# ---- audit event files ---------------------------------------------------------------------------

def test_event_files_name_their_format_after_0_1_0s_parts_which_0_1_0_still_ships(tmp_path: Path) -> None:
    (tmp_path / "b0-000003.jsonl").write_text('{"t": 1}\n')  # 0.1.0's last part before the upgrade
    writer = Writer(str(tmp_path), "b0", 1 << 20)
    writer.write([b'{"t": 2}\n'])
    writer.close()
    assert sorted(os.listdir(tmp_path)) == ["b0-000003.jsonl", "b0~f1-000004.jsonl"]
    assert released("haqueue/audit/parts.py").PART.match("b0~f1-000004.jsonl")


def test_event_readers_take_both_names_and_refuse_a_newer_format(tmp_path: Path, capsys) -> None:
    events, to = tmp_path / "events", tmp_path / "shared"
    events.mkdir()
    to.mkdir()
    for name in ("b0-000001.jsonl", "b1~f1-000001.jsonl"):
        (events / name).write_text('{"t": 1}\n')
    stager = Stager(str(events), str(tmp_path / "watch"))
    assert stager.stage() == 2 * len('{"t": 1}\n')
    newer = events / "b2~f2-000001.jsonl"
    newer.write_text('{"t": 2}\n')
    with pytest.raises(NewerFormat) as raised:
        stager.stage()
    assert str(raised.value) == refused(newer, 2, "1")
    ship = ["audit", "ship", "--from", str(events), "--to", str(to), "--once"]
    assert main([*ship, "--parquet"]) == EXIT_NEWER_FORMAT  # converting reads the lines
    assert capsys.readouterr().err.splitlines()[-1] == f"haqueue audit ship: {refused(newer, 2, '1')}"
    assert main(ship) == 0  # a copy reads none
    assert (to / newer.name).read_bytes() == newer.read_bytes()


# ---- the shard assignment znode ------------------------------------------------------------------

class StoredZnode:
    """The few calls of a KazooClient that stored_assignment.agree makes, on one znode."""

    def __init__(self, data: bytes | None = None) -> None:
        self.data = data

    def ensure_path(self, path: str) -> None:
        pass

    def create(self, path: str, data: bytes) -> None:
        from kazoo.exceptions import NodeExistsError

        if self.data is not None:
            raise NodeExistsError()
        self.data = data

    def get(self, path: str) -> tuple[bytes | None, types.SimpleNamespace]:
        return self.data, types.SimpleNamespace(version=4)


def test_the_stored_assignment_names_its_format_and_a_newer_one_is_refused() -> None:
    pytest.importorskip("kazoo")
    from haqueue.shard.stored_assignment import agree, difference

    ours = {"shards": [{"shard": 0, "replicas": ["n1", "n2"]}], "nodes": ["n1", "n2"]}
    created = StoredZnode()
    assert agree(created, "/hq/c1", ours) == (ours, None)
    assert json.loads(created.data or b"") == {**ours, "format": 1}
    stored, version = agree(StoredZnode(json.dumps(ours).encode()), "/hq/c1", ours)  # as 0.1.0 stored it
    assert (difference(stored, ours), version) == (None, 4)
    assert difference({**ours, "format": 1}, ours) is None  # as 0.1.0's (the same function): shards and nodes
    with pytest.raises(NewerFormat) as raised:
        agree(StoredZnode(json.dumps({**ours, "format": 2}).encode()), "/hq/c1", ours)
    assert str(raised.value) == refused(Path("/hq/c1/assignment"), 2, "1")
