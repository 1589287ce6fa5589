"""`haqueue audit watch` on real brokers: a 3-broker cluster writes audit events while a producer and a
consumer run; the streaming job follows the files as they grow. A loss planted on a backup
(HAQUEUE_TEST_DROP_REPLICA: the backup acknowledges its N-th live copy without keeping it) is named,
queue, backup and message id, within two windows (of event time) of the confirmation; and the job, run --once over a
recorded run, reports the same lag percentiles and missing messages as `haqueue audit lag`."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from audit_command import run_audit_command
from ha_harness import HaCluster, Load, send_all, wait_for
from harness import REPO_ROOT

pytestmark = pytest.mark.slow

QUEUE = "watched"
# Seconds. The alarm comes once the watermark passes the confirmation plus the bound (5 s); a window two
# windows later could close first only if one micro-batch moved the watermark 2 windows less the bound
# (25 s), where micro-batches take 3-8 s on 2 busy cores.
WINDOW = 15.0
DROPPED = 300  # the live copy b2 drops
WARMUP = 100  # messages before the watched ones
LAG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})–")  # a closed window's line: its start


def window_start(text: str) -> float | None:
    """The start of the window a lag line reports (epoch seconds; the watch prints UTC), else None."""
    match = LAG_LINE.match(text)
    return None if match is None else datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


class WatchProcess:
    """`haqueue audit watch ARGS` running, its output lines collected with the time each was read
    (time.time(): the brokers' clock)."""

    def __init__(self, args: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen([sys.executable, "-m", "haqueue", "audit", "watch", *args], cwd=REPO_ROOT,
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []  # stdout
        self.errors: list[tuple[float, str]] = []  # stderr
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, self.errors), daemon=True).start()

    @staticmethod
    def _read(stream, into: list) -> None:
        for line in stream:
            into.append((time.time(), line.rstrip("\n")))

    def line(self, wanted: Callable[[str], bool], timeout: float, what: str) -> tuple[float, str]:
        """The first line `wanted` accepts, and when it was read (bounded wait)."""
        def found():
            assert self.process.poll() is None or any(wanted(text) for _, text in self.lines), \
                f"the watch exited {self.process.returncode}: {self.output()}"
            return next(((t, text) for t, text in self.lines if wanted(text)), None)
        try:
            return wait_for(found, timeout, interval=0.2, message=what)
        except AssertionError as e:
            raise AssertionError(f"{e}; the watch printed:\n{self.output()}") from None

    def output(self) -> str:
        errors = "\n".join(text for _, text in self.errors)
        return "\n".join(text for _, text in self.lines) + "\n" + errors[-3000:]

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def watch_process():
    made: list[WatchProcess] = []

    def start(*args: str) -> WatchProcess:
        made.append(WatchProcess(list(args)))
        return made[-1]

    yield start
    for watch in made:
        watch.stop()


class Producer(Load):
    """Load's producer alone: a message consumed before its confirmation needs no copy on a backup,
    so no consumer may take the one b2 drops before the primary confirms it."""

    def _consume(self) -> None:
        pass


def events_of(directory: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()
            if line.endswith("}")]


# pytest-timeout's 300 s cover the fixtures too: at load 16-23 a fresh JVM for `spark` took 65 s and a cluster's run
# and three audits 236 s, past it; its Failed, raised inside a Py4J call, was reported as the command's
# Py4JError until a broken-off call's connection was closed (sources._drop_broken_calls).
@pytest.mark.timeout(600)
def test_a_planted_loss_is_named_within_two_windows_and_once_over_the_run_agrees_with_audit_lag(
        ha_cluster, watch_process, local_spark, tmp_path, monkeypatch):
    """Live: the watch names the loss planted on b2 within two windows. Then the same events, the cluster's whole
    run, through both jobs (one cluster run for both, a minute of two busy cores): the lag percentiles per queue
    and backup over the whole run (one window holding it all) and the missing messages are the same. A query
    that fails on them exits 4, in one line."""
    from pyspark.sql import functions as F

    from haqueue.audit import lag, watch as watch_job

    events, out = tmp_path / "events", tmp_path / "watch"
    c: HaCluster = ha_cluster(extra={"audit": {"dir": str(events)}})
    c[2].env = {"HAQUEUE_TEST_DROP_REPLICA": f"{QUEUE}:{DROPPED}"}
    primary = c.start_cluster()
    # Both queues exist, and both backups follow them, before a message is sent: a backup that took up
    # a new queue after its messages were confirmed holds them as catch-up copies, which have no lag,
    # and its window never comes (CI, 2 busy cores: b2 took up "warmup" after its 100 messages).
    for queue in ("warmup", QUEUE):
        c.request(primary, "CREATE", "queue", queue)
    for backup in (c[1], c[2]):
        c.wait_ready(backup, queues=["warmup", QUEUE])
    # The warm-up is on disk before the watch starts, so its first micro-batch holds every broker's
    # warm-up events and none can be late. Sent while the watch started (CI, 2 busy cores), a backup's
    # lines could reach the stream after the other brokers' marks had moved the watermark past them:
    # dropped as late, and the window naming that backup never came.
    send_all(c.public, "warmup", range(WARMUP))
    watch = watch_process("--events", str(events), "--window", f"{WINDOW:g}s", "--bound", "5s",
                          "--master", "local[2]")
    watch.line(lambda text: " warmup b2: " in text, 240, "the watch's first window")
    load = Producer(c.public, QUEUE, ledger=tmp_path / "ledger.jsonl").start()  # message-ids: watched-<n>
    try:
        wait_for(lambda: load.confirmed_count() >= DROPPED + 50, 60, message="traffic past the dropped message")
        found, alarm = watch.line(lambda text: text.startswith("MISSING"), 4 * WINDOW, "the missing message")
        for backup in ("b1", "b2"):  # and the lag of both backups, per window
            watch.line(lambda text: f" {QUEUE} {backup}: " in text and " live, lag ms p50 " in text, 4 * WINDOW,
                       f"a window of {backup}'s lag")
    finally:
        load.stop()
    c.shutdown()
    assert watch.stop() == 0
    assert sum(text.startswith("MISSING") for _, text in watch.lines) == 1

    # The message b2 dropped: confirmed by b0 naming b2, never logged by b2.
    logged = events_of(events)
    held = {(e["uid"], e["seq"]) for e in logged if e["broker"] == "b2" and e["event"] == "replicate"}
    dropped = [e for e in logged if e["broker"] == "b0" and e["event"] == "complete" and "b2" in e["backups"]
               and (e["uid"], e["seq"]) not in held]
    assert len(dropped) == 1, dropped
    lost = dropped[0]
    assert alarm.startswith(f"MISSING {QUEUE} on b2: message {lost['message_id']} (seq {lost['seq']}), confirmed ")
    print(f"named {found - lost['t'] / 1e6:.1f} s after its confirmation: {alarm}")
    # Within two windows of event time, whatever the machine's speed: named before the watch closed any
    # window starting two windows after the confirmation's (a micro-batch's lag lines come before its
    # missing ones, so one batch closing both would need its watermark to jump 2 windows less the bound).
    confirmation_window = lost["t"] / 1e6 // WINDOW * WINDOW
    printed = [text for _, text in watch.lines]
    later = [text for text in printed[:printed.index(alarm)]
             if (start := window_start(text)) is not None and start >= confirmation_window + 2 * WINDOW]
    assert not later, f"named after the watch had moved two windows past its confirmation: {later}"

    batch = lag.analyse(local_spark(), str(events))  # this process's JVM, started once the live part is over
    result = run_audit_command(["audit", "watch", "--events", str(events), "--once", "--window", "100000d",
                                "--parquet", str(out), "--master", "local[2]"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = pd.read_parquet(out)
    columns = ["queue", "backup", "live", "lag_p50_ms", "lag_p95_ms", "lag_p99_ms", "lag_max_ms"]
    streamed = rows[rows["kind"] == "lag"][columns].sort_values(["queue", "backup"], ignore_index=True)
    whole = batch.backups[batch.backups["live"] > 0][columns].sort_values(["queue", "backup"], ignore_index=True)
    print(streamed.to_string(), whole.to_string(), sep="\n")
    assert streamed[["queue", "backup"]].values.tolist() == [[q, b] for q in ("warmup", QUEUE) for b in ("b1", "b2")]
    pd.testing.assert_frame_equal(streamed, whole, check_dtype=False)

    missing = rows[rows["kind"] == "missing"][["queue", "backup", "seq", "message_id"]]
    problems = batch.problems[batch.problems["problem"] == "missing"][["queue", "backup", "seq", "message_id"]]
    assert sorted(map(tuple, missing.values.tolist())) == sorted(map(tuple, problems.values.tolist()))
    assert missing.values.tolist() == [[QUEUE, "b2", lost["seq"], lost["message_id"]]]

    query = watch_job.results
    monkeypatch.setattr(watch_job, "results", lambda *args: query(*args).withColumn(
        "queue", F.raise_error(F.lit("planted failure"))))
    result = run_audit_command(["audit", "watch", "--events", str(events), "--once", "--master", "local[2]"])
    assert result.returncode == 4, result.stdout + result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == "haqueue audit: the Spark job failed: [USER_RAISED_EXCEPTION] planted " \
                                             "failure SQLSTATE: P0001"


class Interrupted(BaseException):
    """An interrupt other than Ctrl-C's (which Py4J cleans up after itself): a caller's timeout, as pytest-timeout's
    Failed."""


def test_a_timeout_inside_a_call_to_the_jvm_passes_through_and_leaves_the_process_usable(spark, scenario_dir,
                                                                                          tmp_path, monkeypatch):
    """An interrupt that breaks off `audit lag`'s first query (its toPandas sent, its answer not read yet, as a
    signal's handler raising leaves it) comes out of the command as itself, and the next session of the process
    works. The answer left on the connection once came to the call after it: the command's stop failed with
    'SparkSession does not exist in the JVM' in place of the interrupt, then every later session with KeyError 'c'."""
    from py4j.clientserver import ClientServerConnection

    from haqueue.audit import sources

    send = ClientServerConnection.send_command
    broken: list[str] = []

    def send_command(self, command: str) -> str:
        if not broken and any(f"\n{name}\n" in command for name in ("collectToPython", "collectAsArrowToPython")):
            broken.append(command)
            self.socket.sendall(command.encode("utf-8"))
            raise Interrupted()
        return send(self, command)

    monkeypatch.setattr(ClientServerConnection, "send_command", send_command)
    with pytest.raises(Interrupted):
        run_audit_command(["audit", "lag", "--events", str(scenario_dir), "--out", str(tmp_path / "out"),
                           "--master", "local[2]"])
    assert broken
    monkeypatch.undo()
    assert sources.session("local[2]").range(3).count() == 3
