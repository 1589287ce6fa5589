"""A full disk under the journal: durable publishes are refused, transient ones flow, nothing confirmed is
lost, and service resumes by itself when space returns. The data dir is a small tmpfs (root only)."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest
from proton import Delivery, Message

from clients import Client
from harness import wait_for


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path) -> None:
    """Write until the file system refuses."""
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def test_full_disk_refuses_durable_publishes_keeps_transient_ones_and_resumes(broker_factory, small_disk):
    b = broker_factory(data_dir=str(small_disk / "data"))
    with Client(b) as c:
        c.send("q", [Message(body=i, durable=True) for i in range(50)])
        _fill(small_disk / "ballast")
        big = "x" * 100_000  # more than what is left of the segment's last page: its write fails
        waiting = c.sender("q").link.send(Message(body=big, durable=True))
        wait_for(lambda: c.mgmt("READ", "store").body["failing"], 10, message="the store noticing the full disk")
        refused = c.send_one("q", Message(body=51, durable=True))
        assert refused.remote_state == Delivery.REJECTED
        condition = refused.remote.condition
        assert condition.name == "amqp:resource-limit-exceeded"
        assert "the disk is full" in condition.description and "queue 'q'" in condition.description
        assert c.send_one("q", Message(body="transient")).remote_state == Delivery.ACCEPTED
        assert not waiting.settled
        assert "the disk is full" in b.log()
        os.unlink(small_disk / "ballast")  # space returns
        c.wait(lambda: waiting.settled, 10, "the waiting publish confirmed once space returned")
        assert waiting.remote_state == Delivery.ACCEPTED
        c.send("q", [Message(body=52, durable=True)])
        assert c.mgmt("READ", "store").body["failing"] is None
    assert "journal writes succeed again" in b.log()
    b.kill()
    with Client(b.start()) as c:
        assert [m.body for m in c.receiver("q", credit=60).receive_n(52)] == list(range(50)) + [big, 52]
