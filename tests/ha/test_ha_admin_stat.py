"""What an operator watching a cluster sees: `haqueue admin stat` on the primary (its queues, and its
backups with state, lag and catch-up), and `admin ha status --watch` following a backup's catch-up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from proton import Message

from harness import REPO_ROOT
from ha_harness import HaCluster, send_all, wait_for
from haqueue import __version__
from haqueue.ha.protocol import PROTOCOL

pytestmark = pytest.mark.timeout(120)


def test_stat_on_the_primary_lists_its_backups(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    send_all(c.public, "orders", range(12))
    r = c.cli(p, "stat", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{p.name}: primary active, epoch 1"), r.stdout
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.strip()}
    assert rows["orders"][1] == "12", r.stdout
    assert rows["backup"] == ["backup", "state", "lag", "msgs", "lag", "s", "catch-up", "release", "protocol"], r.stdout
    for b in ("b1", "b2"):
        assert rows[b][1:] == ["ready", "0", "0.000", "-", __version__, str(PROTOCOL)], r.stdout
    # on a backup: its own state and whom it follows, no backups
    r = c.cli(c[1], "stat", "--interval", "0.2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"b1: backup ready, epoch 1, following {p.name}"), r.stdout
    assert "lag msgs" not in r.stdout


def test_ha_status_watch_prints_one_object_a_line(ha_cluster):
    c = ha_cluster()
    p = c.start_cluster()
    r = c.cli(p, "ha", "status", "--watch", "--count", "2", "--interval", "0.2")
    assert r.returncode == 0, r.stderr
    objects = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(objects) == 2 and all(o["role"] == "primary" for o in objects), r.stdout
    backup = objects[-1]["backups"][0]
    assert backup["lag_seconds"] == 0 and backup["catchup"] == {"done": 0, "total": 0}, backup


def _watch(c: HaCluster, b, interval: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "haqueue", "admin", "-b", b.address, "--user", "ops",
                             "--password", c.password, "ha", "status", "--watch", "--interval", str(interval)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_ha_status_watch_shows_catchup_progress(ha_cluster):
    c = ha_cluster()
    c.start(0, 1)
    p = c[0]
    c.promote(p)
    c.wait_ready(c[1])
    n = 5000
    send_all(c.public, "big", [Message(body="x" * 1000, durable=True) for _ in range(n)], timeout=60)
    # b2 stops itself on its 100th catch-up message (test_hooks.py); the primary, short of its credit, holds the rest
    c[2].env = {"HAQUEUE_TEST_STOP_IN_CATCHUP": "big:100"}
    watch = _watch(c, p, 0.05)
    progress = []  # b2's catch-up as each line showed it
    try:
        c.start(2)
        c.stopped.add(c[2].name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = watch.stdout.readline()
            assert line, f"ha status --watch ended: {watch.stderr.read()}"
            b2 = next((x for x in json.loads(line)["backups"] if x["name"] == "b2"), None)
            if b2 is None:
                continue
            progress.append((b2["state"], b2["catchup"]["done"], b2["catchup"]["total"]))
            if (b2["state"] == "catchup" and 0 < b2["catchup"]["done"] < n and c[2].name in c.stopped
                    and c.halted(c[2])):
                c.sigcont(c[2])  # seen part way, and stopped (not before: it would stop after this): let it finish
            if b2["state"] == "ready":
                break
    finally:
        if c[2].name in c.stopped:
            c.sigcont(c[2])
        watch.terminate()
        watch.wait(10)
    midway = [(done, total) for state, done, total in progress if state == "catchup" and 0 < done < total]
    assert midway, f"no line showed b2 part way through its catch-up: {progress}"
    assert all(total == n for _, total in midway), midway
    dones = [done for done, _ in midway]
    assert dones == sorted(dones), f"catch-up progress went back: {dones}"
    assert progress[-1][0] == "ready", progress
