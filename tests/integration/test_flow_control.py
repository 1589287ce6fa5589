"""Flow control as publishers and operators see it: per-queue `max_depth`/`max_bytes` and the
broker's `memory_limit` under each overflow policy (block, reject-publish, drop-head).

Each flood is tests/js/flood.js: a rhea publisher that sends as fast as the broker's credit allows,
to a queue nobody consumes from, while a thread samples the broker's RSS (VmRSS). Without flow
control such a flood grows the broker by about 70 MB a second here; the floods below push
FLOOD_BYTES through (or stall), and the broker's RSS must stay within RSS_ALLOWANCE of where it
started. Messages carry their sequence number, so the consumers can tell exactly which arrived.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from clients import Client, Receiver
from ha_harness import HaCluster, cluster_factory, send_all
from harness import BrokerProcess, rss, run_haqueue, wait_for

pytestmark = pytest.mark.timeout(60)

JS_DIR = Path(__file__).resolve().parent.parent / "js"
NODE = shutil.which("node")
HAVE_RHEA = NODE is not None and (JS_DIR / "node_modules" / "rhea").is_dir()

BODY = 1024  # body bytes of a flood message; 1,040 bytes encoded
ENCODED = 1040
CREDIT_WINDOW = 2000  # credit a publisher link may hold: how far a blocked queue can overshoot its limit
FLOOD_BYTES = 96 * 2 ** 20  # what the floods that do not stall push through
RSS_ALLOWANCE = 32 * 2 ** 20  # RSS growth allowed during a flood: a third of FLOOD_BYTES
STALL_WINDOW = 0.5  # seconds a stalled publisher is watched to see that it stays stalled


# ---- the flood and the RSS sampler ---------------------------------------------------------------

class Flood:
    """tests/js/flood.js as a process; `progress` is its latest report, `final` its last."""

    def __init__(self, broker: BrokerProcess, address: str, size: int = BODY) -> None:
        options = {"host": broker.host, "port": broker.port, "address": address, "size": size, "report_ms": 20}
        self.address = address
        self.proc = subprocess.Popen([NODE, str(JS_DIR / "flood.js"), json.dumps(options)], cwd=JS_DIR,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.progress: dict[str, Any] = {"opened": False, "sent": 0, "accepted": 0, "rejected": 0, "credit": 0,
                                         "errors": []}
        self.final: dict[str, Any] | None = None
        self.other_output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                self.other_output.append(line)
                continue
            self.progress = report
            if report.get("done"):
                self.final = report

    def __getitem__(self, key: str) -> Any:
        return self.progress[key]

    def wait(self, condition: Callable[[dict[str, Any]], Any], what: str, timeout: float = 30) -> None:
        """Poll `condition` on the latest report (one report: its counts agree with each other)."""
        def check() -> Any:
            if self.final is not None:
                raise AssertionError(f"flood to {self.address} ended while waiting for {what}: {self.final} "
                                     f"{''.join(self.other_output)}")
            return condition(self.progress)
        try:
            wait_for(check, timeout, interval=0.02, message=f"flood to {self.address}: {what}")
        except AssertionError as e:
            raise AssertionError(f"{e} (its last report: {self.progress})") from None

    def stop(self) -> dict[str, Any]:
        """Stop sending; the final report once every message sent is settled."""
        self.proc.stdin.close()
        self.proc.wait(timeout=15)
        self._reader.join(5)
        assert self.final is not None, f"flood to {self.address} gave no final report: {self.other_output}"
        assert self.proc.returncode == 0, f"flood to {self.address} failed: {self.final}"
        return self.final

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def flood():
    """`flood(broker, address)` starts a flood; any still running is killed after the test."""
    if not HAVE_RHEA:
        pytest.skip("node or rhea missing (run `npm install` in tests/js)")
    started: list[Flood] = []

    def start(broker: BrokerProcess, address: str) -> Flood:
        started.append(Flood(broker, address))
        return started[-1]

    yield start
    for f in started:
        f.kill()


class RssSampler:
    """Samples a broker's RSS every 20 ms on a thread; `growth` is the peak over the first sample."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.pid = broker.pid
        self.start = self.peak = rss(self.pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, rss(self.pid))
        print(f"\nRSS of the broker: {self.start / 2 ** 20:.1f} MiB before, peak {self.peak / 2 ** 20:.1f} MiB "
              f"(+{self.growth / 2 ** 20:.1f} MiB)")

    @property
    def growth(self) -> int:
        return self.peak - self.start

    def assert_bounded(self) -> None:
        assert self.growth < RSS_ALLOWANCE, \
            f"the broker's RSS grew by {self.growth / 2 ** 20:.1f} MiB (allowed {RSS_ALLOWANCE / 2 ** 20:.0f})"


# ---- helpers ---------------------------------------------------------------------------------------

def seqs(received: list) -> list[int]:
    """The sequence numbers flood.js wrote at the start of each body."""
    return [int(struct.unpack_from("<d", r.body)[0]) for r in received]


def queue_info(c: Client, name: str) -> dict[str, Any]:
    return c.mgmt("READ", "queue", name).body


def wait_stalled(f: Flood) -> None:
    """The publisher has no credit and the broker has settled all it sent (flood.js counts as sent
    only what its credit covered: nothing is in flight); then it stays so."""
    f.wait(lambda p: p["opened"] and p["credit"] == 0 and p["accepted"] + p["rejected"] == p["sent"],
           "no credit left and every message sent settled")
    accepted = f["accepted"]
    deadline = time.monotonic() + STALL_WINDOW
    while time.monotonic() < deadline:  # a bounded observation, not a wait for something
        assert f["accepted"] == accepted and f["credit"] == 0, f"the publisher is not stalled: {f.progress}"
        time.sleep(0.02)


def wait_resumed(f: Flood, accepted: int) -> None:
    f.wait(lambda p: p["accepted"] > accepted, f"more than {accepted} accepted (the publisher resumed)")


def drain(receiver: Receiver, n: int) -> list:
    """`n` messages, accepted; the broker has processed the accepts when it returns."""
    got = receiver.receive_n(n, timeout=30) if n else []
    receiver.client.roundtrip()
    return got


def flood_until(f: Flood, nbytes: int) -> dict[str, Any]:
    f.wait(lambda p: p["sent"] * ENCODED >= nbytes, f"{nbytes // 2 ** 20} MiB sent", timeout=45)
    return f.stop()


# ---- block ---------------------------------------------------------------------------------------

def test_block_stalls_the_publisher_until_a_consumer_drains(broker_factory, flood):
    b = broker_factory(queues=[{"name": "fc.block", "args": {"max_bytes": 2 ** 20}}])
    with Client(b) as c:
        with RssSampler(b) as memory:
            f = flood(b, "fc.block")
            wait_stalled(f)
        memory.assert_bounded()
        stalled = queue_info(c, "fc.block")
        assert stalled["depth"] == f["accepted"] and f["rejected"] == 0
        assert 2 ** 20 <= stalled["bytes"] <= 2 ** 20 + CREDIT_WINDOW * ENCODED, stalled
        # a consumer drains the queue: the publisher gets credit again
        r = c.receiver("fc.block", credit=0)
        got = drain(r, stalled["depth"])
        wait_resumed(f, stalled["depth"])
        final = f.stop()
        assert final["rejected"] == 0 and final["accepted"] == final["sent"], final
        got += drain(r, final["accepted"] - len(got))
        assert seqs(got) == list(range(final["accepted"])), "lost, duplicated or reordered messages"
        c.roundtrip()
        assert queue_info(c, "fc.block")["depth"] == 0


def test_block_on_max_depth_holds_new_publishers_too(broker_factory, flood):
    b = broker_factory(queues=[{"name": "fc.depth", "args": {"max_depth": 500}}])
    with Client(b) as c:
        first = flood(b, "fc.depth")
        wait_stalled(first)
        depth = queue_info(c, "fc.depth")["depth"]
        assert 500 <= depth <= 500 + CREDIT_WINDOW
        # a publisher attaching to the blocked queue gets no credit at all
        second = flood(b, "fc.depth")
        second.wait(lambda p: p["opened"], "the second publisher's link to open")
        wait_stalled(second)
        assert second["sent"] == 0
        stalled = first["accepted"]
        r = c.receiver("fc.depth", credit=0)
        got = drain(r, depth)
        wait_resumed(first, stalled)
        wait_resumed(second, 0)
        finals = [first.stop(), second.stop()]
        got += drain(r, sum(f["accepted"] for f in finals) - len(got))
        assert sorted(seqs(got)) == sorted(list(range(finals[0]["accepted"])) + list(range(finals[1]["accepted"])))


def test_block_holds_an_exchange_publisher_while_a_bound_queue_is_full(broker_factory, flood):
    b = broker_factory(queues=[{"name": "fc.small", "args": {"max_depth": 300}}, {"name": "fc.big"}],
                       exchanges=[{"name": "fc.fan", "type": "fanout"}],
                       bindings=[{"exchange": "fc.fan", "queue": "fc.small"}, {"exchange": "fc.fan", "queue": "fc.big"}])
    with Client(b) as c:
        f = flood(b, "fc.fan")
        wait_stalled(f)
        small, big = queue_info(c, "fc.small"), queue_info(c, "fc.big")
        assert small["depth"] == big["depth"] == f["accepted"]
        assert 300 <= small["depth"] <= 300 + CREDIT_WINDOW
        got = drain(c.receiver("fc.small", credit=0), small["depth"])
        wait_resumed(f, small["depth"])
        final = f.stop()
        assert final["accepted"] == final["sent"] and final["rejected"] == 0, final
        assert seqs(got) == list(range(small["depth"]))
        assert queue_info(c, "fc.big")["depth"] == final["accepted"]


# ---- reject-publish ------------------------------------------------------------------------------

def test_reject_publish_rejects_what_does_not_fit(broker_factory, flood):
    b = broker_factory(queues=[{"name": "fc.reject", "args": {"max_bytes": 2 ** 20, "overflow": "reject-publish"}}])
    with Client(b) as c:
        with RssSampler(b) as memory:
            final = flood_until(flood(b, "fc.reject"), FLOOD_BYTES)
        memory.assert_bounded()
        info = queue_info(c, "fc.reject")
        assert final["accepted"] == info["depth"] and final["accepted"] + final["rejected"] == final["sent"]
        assert info["bytes"] <= 2 ** 20 < info["bytes"] + ENCODED, info
        [error] = [json.loads(e) for e in final["errors"]]
        assert error["condition"] == "amqp:resource-limit-exceeded", error
        assert "fc.reject" in error["description"] and "max_bytes 1048576" in error["description"], error
        got = drain(c.receiver("fc.reject", credit=0), info["depth"])
        assert seqs(got) == list(range(info["depth"])), "the queue should hold the oldest messages"


# ---- drop-head -----------------------------------------------------------------------------------

def test_drop_head_keeps_the_newest_messages(broker_factory, flood):
    b = broker_factory(queues=[{"name": "fc.drop", "args": {"max_depth": 1000, "overflow": "drop-head"}}])
    with Client(b) as c:
        with RssSampler(b) as memory:
            final = flood_until(flood(b, "fc.drop"), FLOOD_BYTES)
        memory.assert_bounded()
        assert final["accepted"] == final["sent"] and final["rejected"] == 0, final
        info = queue_info(c, "fc.drop")
        assert info["depth"] == 1000 and info["bytes"] == 1000 * ENCODED, info
        assert info["dropped"] == final["accepted"] - 1000, info
        got = drain(c.receiver("fc.drop", credit=0), 1000)
        assert seqs(got) == list(range(final["accepted"] - 1000, final["accepted"]))


# ---- the broker's memory_limit -------------------------------------------------------------------

def test_memory_limit_blocks_publishers_to_every_queue_then_resumes(broker_factory, flood):
    names = ["fc.m0", "fc.m1", "fc.m2"]
    b = broker_factory(limits={"memory_limit": 3 * 2 ** 20})
    with Client(b) as c:
        with RssSampler(b) as memory:
            floods = [flood(b, name) for name in names]
            for f in floods:
                wait_stalled(f)
        memory.assert_bounded()
        status = c.mgmt("READ", "broker").body
        held = sum(queue_info(c, name)["bytes"] for name in names)
        assert status["memory_alarm"] is True and status["memory_limit"] == 3 * 2 ** 20, status
        assert 3 * 2 ** 20 <= held <= status["memory_used"] <= 3 * 2 ** 20 + 3 * CREDIT_WINDOW * ENCODED, status
        assert "memory alarm: queues hold" in b.log()
        stalled = [f["accepted"] for f in floods]
        receivers = [c.receiver(name, credit=0) for name in names]
        got = [drain(r, n) for r, n in zip(receivers, stalled)]
        for f, n in zip(floods, stalled):
            wait_resumed(f, n)
        assert "memory alarm cleared" in b.log()
        finals = [f.stop() for f in floods]
        for r, final, some in zip(receivers, finals, got):
            some += drain(r, final["accepted"] - len(some))
            assert seqs(some) == list(range(final["accepted"])), "lost, duplicated or reordered messages"
        assert c.mgmt("READ", "broker").body["memory_alarm"] is False


def test_memory_alarm_applies_each_queues_policy(broker_factory, flood):
    b = broker_factory(limits={"memory_limit": 2 ** 20},
                       queues=[{"name": "fc.full", "args": {}},
                               {"name": "fc.rej", "args": {"overflow": "reject-publish"}},
                               {"name": "fc.drops", "args": {"overflow": "drop-head"}}])
    with Client(b) as c:
        wait_stalled(flood(b, "fc.full"))  # takes the broker over its memory_limit
        rejected, dropping = flood(b, "fc.rej"), flood(b, "fc.drops")
        rejected.wait(lambda p: p["rejected"] >= 100, "100 publishes rejected")
        dropping.wait(lambda p: p["accepted"] >= 5000, "5000 publishes accepted")
        [error] = [json.loads(e) for e in rejected.stop()["errors"]]
        assert error["condition"] == "amqp:resource-limit-exceeded"
        assert "fc.rej" in error["description"] and "memory_limit (1048576 bytes)" in error["description"], error
        final = dropping.stop()
        info = queue_info(c, "fc.drops")  # under the alarm each publish drops as much as it adds
        assert info["depth"] == 1 and info["dropped"] == final["accepted"] - 1, info


# ---- HA ------------------------------------------------------------------------------------------

@pytest.fixture
def ha_cluster(tmp_path):
    yield from cluster_factory(HaCluster, tmp_path)


def test_a_backup_over_its_memory_limit_still_takes_replication(ha_cluster):
    """The primary confirms a publish only once its backup has the message: a backup that held its
    replication links' credit would stall every publisher of the cluster."""
    c = ha_cluster(size=2)
    c[1].config["limits"] = {"memory_limit": 64 * 1024}
    c.start_cluster()
    send_all(c.public, "fc.ha", ["x" * 1024] * 300)
    c.wait_depth(c[1], "fc.ha", 300)
    status = c.request(c[1], "READ", "broker")
    assert status["memory_alarm"] is True and status["memory_used"] > 300 * 1024, status
    assert "memory alarm: queues hold" in c[1].log()


# ---- status and configuration --------------------------------------------------------------------

def test_status_shows_bytes_and_memory(broker):
    with Client(broker) as c:
        c.send("fc.status", ["x" * 100] * 3)
        info = queue_info(c, "fc.status")
        assert info["depth"] == 3 and 300 < info["bytes"] < 400 and info["dropped"] == 0, info
        status = c.mgmt("READ", "broker").body
        assert status["memory_used"] >= info["bytes"] and status["memory_alarm"] is False, status
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        assert status["memory_limit"] == int(ram * 0.4), "the default memory_limit is 40% of the machine's RAM"
    listed = {q["name"]: q for q in map(json.loads, run_haqueue(["admin", "-b", broker.address, "queue", "list"])
                                         .stdout.splitlines())}
    assert listed["fc.status"]["bytes"] == info["bytes"]


def test_limits_give_queues_their_defaults(broker_factory):
    b = broker_factory(limits={"max_depth": 2, "overflow": "reject-publish"})
    with Client(b) as c:
        c.send("fc.defaults", ["1", "2"])
        d = c.send_one("fc.defaults", "3")
        assert d.remote.condition.name == "amqp:resource-limit-exceeded", d.remote.condition
        assert queue_info(c, "fc.defaults")["args"] == {"max_depth": 2, "overflow": "reject-publish"}


def test_bad_overflow_refused_at_declare(broker):
    p = run_haqueue(["admin", "-b", broker.address, "queue", "add", "fc.bad", "--arg", "overflow=sometimes"])
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "'overflow' must be one of block, reject-publish, drop-head, got 'sometimes'" in p.stderr, p.stderr
    with Client(broker) as c:
        bad = c.mgmt("CREATE", "queue", "fc.bad", {"max_bytes": -1}, expect=None)
        assert bad.status == 400 and "'max_bytes' must be >= 0" in bad.description, bad.description
        assert "fc.bad" not in c.queue_names()


@pytest.mark.parametrize("config, code, reason", [
    ({"limits": {"overflow": "sometimes"}}, 2,
     'limits.overflow: must be block or reject-publish or drop-head, got "sometimes"'),
    ({"limits": {"memory_limit": "1G"}}, 2, 'limits.memory_limit: must be a non-negative integer, got "1G"'),
    ({"queues": [{"name": "q", "args": {"overflow": "drop-tail"}}]}, 1,
     "queue 'q': argument 'overflow' must be one of block, reject-publish, drop-head, got 'drop-tail'"),
])
def test_bad_flow_config_stops_the_broker(tmp_path, config, code, reason):
    b = BrokerProcess(tmp_path / "bad", config, name="bad")
    b.start(wait=False)
    try:
        assert b.wait(timeout=15) == code, b.log()
    finally:
        b.kill()
    assert reason in b.log(), b.log()
