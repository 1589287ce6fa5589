"""The audit on a Spark standalone cluster, as issue 29's multi-machine user runs it: three brokers, each writing
its events to its own directory, a loss planted on a backup (HAQUEUE_TEST_DROP_REPLICA); `haqueue audit ship`
copies each broker's files to the shared directory; a master and two one-core workers (spark_standalone.py),
which see that directory and nothing of the brokers' own, audit them:

- `haqueue audit lag --master spark://...` finds the loss and exits 1, its tasks run on both workers;
- spark-submit with the documented environment, pointed at a broker's own directory, which the driver lists
  and no worker sees: the job fails, exit 4, a one-line reason on stderr, nothing on stdout;
- `haqueue audit watch --master spark://...` names the lost message.

The JVMs start once for the module, while the brokers run; the brokers' events serve every test."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from proton import Message

from audit_command import run_audit_command
from ha_harness import HaCluster, send_all
from harness import run_haqueue
from spark_standalone import StandaloneCluster, hidden_from_workers
from test_lag import spark_submit

pytestmark = pytest.mark.slow

QUEUE = "q"
DROPPED = 5  # the live copy b2 drops


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    pytest.importorskip("pyspark")
    if os.geteuid() != 0:
        pytest.skip("the workers' mount namespaces need root")
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()  # an earlier test's, local: a command would join it
    if running is not None:
        running.stop()
    cluster = StandaloneCluster(hidden_from_workers(tmp_path_factory.getbasetemp()))
    try:
        yield cluster.start()  # the workers once the brokers' run is shipped (`shipped`)
    finally:
        print(cluster.logs())
        cluster.stop()


def conf(cluster: StandaloneCluster) -> list[str]:
    return [arg for key, value in cluster.conf.items() for arg in ("--conf", f"{key}={value}")]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, standalone) -> tuple[Path, list[Path], str]:
    """(the shared events directory, each broker's own, the message-id of the copy b2 dropped): three brokers,
    a loss planted on b2, each broker's closed files shipped to the shared directory; the Spark cluster up."""
    c = HaCluster(tmp_path_factory.mktemp("brokers"))
    for b in c:
        b.config["audit"] = {"dir": str(b.directory / "events")}
    c[2].env = {"HAQUEUE_TEST_DROP_REPLICA": f"{QUEUE}:{DROPPED}"}
    try:
        c.start_cluster()
        send_all(c.public, QUEUE, [Message(id="m-0", durable=True)])  # the queue, caught up on every backup
        for b in c.brokers[1:]:
            c.wait_ready(b, queues=[QUEUE])
        send_all(c.public, QUEUE, [Message(id=f"m-{i}", durable=True) for i in range(1, 20)])
    finally:
        c.shutdown()
        print(c.log_tails(40))
    shared = standalone.shared / "events"
    shared.mkdir()
    own = [b.directory / "events" for b in c]
    for events in own:
        result = run_haqueue(["audit", "ship", "--from", str(events), "--to", str(shared), "--once"])
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in shared.iterdir()) == sorted(p.name for d in own for p in d.glob("*.jsonl"))
    standalone.wait()
    return shared, own, dropped_copy(shared)


def dropped_copy(events: Path) -> str:
    """The message b0 confirmed naming b2 that b2 never logged."""
    logged = [json.loads(line) for f in events.iterdir() for line in f.read_text().splitlines()]
    held = {e["seq"] for e in logged if e["broker"] == "b2" and e["event"] == "replicate"}
    dropped = [e["message_id"] for e in logged
               if e["event"] == "complete" and "b2" in e["backups"] and e["seq"] not in held]
    assert len(dropped) == 1, dropped
    return dropped[0]


def test_audit_lag_on_the_cluster_finds_the_planted_loss(standalone, shipped, tmp_path):
    events, _, lost = shipped
    out = tmp_path / "audit"
    result = run_audit_command(["audit", "lag", "--events", str(events), "--out", str(out), "--master",
                                standalone.url, "--fail-on-loss", *conf(standalone)])
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "LOSS: 1 confirmed message missing on a ready backup (see problems.csv)"
    problems = pd.read_csv(out / "problems.csv")
    assert problems[["problem", "message_id", "backup"]].values.tolist() == [["missing", lost, "b2"]]
    assert standalone.hosts_that_ran_tasks(standalone.last_application()) == set(standalone.workers)


def test_spark_submit_on_events_the_workers_cannot_read_fails_in_one_line(standalone, shipped, tmp_path):
    _, own, _ = shipped
    result = spark_submit(["--events", str(own[0]), "--out", str(tmp_path / "audit"), "--fail-on-loss"],
                          sys.executable, master=standalone.url, conf=conf(standalone))
    assert (result.returncode, result.stdout) == (4, ""), result.stdout + result.stderr[-3000:]
    assert re.fullmatch(rf"haqueue audit: the Spark job failed: executors cannot read "
                        rf"file://{own[0]}/b0~f1-\d+\.jsonl \(FILE_NOT_EXIST\); is the events directory shared "
                        r"with every worker\?",
                        result.stderr.splitlines()[-1]), result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_audit_watch_on_the_cluster_names_the_planted_loss(standalone, shipped):
    """Its staged files are in the shared directory (--checkpoint), where the executors read them."""
    events, _, lost = shipped
    result = run_audit_command(["audit", "watch", "--events", str(events), "--checkpoint",
                                str(standalone.shared / "watch"), "--once", "--master", standalone.url,
                                *conf(standalone)])
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    missing = [line for line in result.stdout.splitlines() if line.startswith("MISSING")]
    assert len(missing) == 1 and missing[0].startswith(f"MISSING {QUEUE} on b2: message {lost} "), result.stdout
    assert standalone.hosts_that_ran_tasks(standalone.last_application()) == set(standalone.workers)
