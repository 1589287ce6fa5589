"""ZooKeeper coordination against a real 3-server ensemble (design/zookeeper.md); all but the config
checks are slow (a real ensemble and brokers)."""
from __future__ import annotations

import json
import threading
import time

import pytest
import yaml

from proton import Message

from ha_harness import HA_USER, receive, send_all
from harness import BrokerProcess, free_port, run_haqueue, wait_for
from zk_cluster import PinnedPublisher, Producer, drain, received_of_confirmed


@pytest.mark.slow
def test_first_election(zk_cluster):
    c = zk_cluster()
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    status = c.status(p)
    assert status["coordinator"] == "zookeeper" and status["epoch"] == 1
    zk = status["zookeeper"]
    assert zk["session"] == "connected" and zk["primary"] == p.name and zk["zk_epoch"] == 1
    # the members as the primary's watch last saw them: a backup can be ready before its node's watch event is in
    wait_for(lambda: set(c.status(p)["zookeeper"]["members"]) == {"b0", "b1", "b2"}, 10,
             message="the primary seeing every member in ZooKeeper")
    assert len(c.primaries()) == 1
    # the CLI shows it too
    r = run_haqueue(["admin", "-b", p.address, "--user", HA_USER, "--password", c.password, "ha", "status"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["zookeeper"]["primary"] == p.name
    # under ZooKeeper only the election promotes
    backup = next(b for b in c.brokers if b is not p)
    for force in ([], ["--force"]):
        r = run_haqueue(["admin", "-b", backup.address, "--user", HA_USER, "--password", c.password,
                         "ha", "promote", *force])
        assert r.returncode == 1 and ("elected through ZooKeeper" in r.stderr or
                                      f"{p.name} is the elected primary" in r.stderr), r.stderr
    assert c.primaries() == [p]


def _first_accept_after(producer: Producer, moment: float, address: str) -> float:
    return wait_for(lambda: min((t for t, a in producer.snapshot().values() if t > moment and a == address),
                                default=None), 30, message=f"a publish accepted by {address}")


@pytest.mark.slow
def test_kill9_primary_under_load(zk_cluster):
    c = zk_cluster()
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    producer = Producer(c.addresses, "load").start()
    try:
        wait_for(lambda: producer.count() >= 500, 30, message="500 confirmed before the kill")
        killed = time.monotonic()
        p.kill()
        new = c.wait_primary(timeout=c.session_timeout + 10, exclude=(p,))
        elected = time.monotonic()
        served = _first_accept_after(producer, killed, new.address)
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 500, 30, message="500 confirmed after the failover")
    finally:
        producer.stop()
    confirmed, got, lost = received_of_confirmed(producer, new.address)
    print(f"ZooKeeper failover (session_timeout {c.session_timeout}s): primary seen after "
          f"{elected - killed:.2f}s, first publish accepted after {served - killed:.2f}s; "
          f"{len(confirmed)} confirmed, {len(got)} received, {len(got) - len(set(got))} duplicates, lost {lost[:10]}")
    assert lost == []
    p.start()  # the old primary comes back as a backup
    c.wait_state(p, "backup", "ready")
    assert c.primaries() == [new]


@pytest.mark.slow
@pytest.mark.breaks_ensemble  # kills its leader
def test_zookeeper_leader_killed_brokers_undisturbed(zk_cluster, ensemble):
    c = zk_cluster()
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    epoch = c.status(p)["epoch"]
    producer = Producer(c.addresses, "steady").start()
    try:
        wait_for(lambda: producer.count() >= 200, 30, message="traffic before the ZooKeeper leader dies")
        leader = ensemble.leader()
        leader.kill()
        ensemble.wait_serving()
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 300, 30, message="traffic after the ZooKeeper leader died")
        time.sleep(2 * c.session_timeout)  # long enough for any lease or session trouble to show
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 100, 30, message="traffic still flowing")
    finally:
        producer.stop()
    assert c.primaries() == [p]
    assert c.status(p)["epoch"] == epoch
    logs = "".join(b.log() for b in c.brokers)
    assert logs.count("won the ZooKeeper election") == 1 and "fenced" not in logs
    assert all(b.log().count(f"broker {b.name} running") == 1 for b in c.brokers)  # nobody re-executed
    assert all(c.status(b)["zookeeper"]["session"] == "connected" for b in c.brokers)
    # confirmed publishes all went to the one primary
    assert {a for _, a in producer.snapshot().values()} == {p.address}


@pytest.mark.slow
@pytest.mark.breaks_ensemble  # stops every server
def test_a_primary_cut_off_from_zookeeper_confirms_nothing_from_that_moment(zk_cluster, ensemble):
    """Every ZooKeeper server gone: the primary's session is suspended at once, and it holds every publish from
    then on, its backups healthy and its lease not yet run out (design/zookeeper.md); the lease then fences it."""
    c = zk_cluster()
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    pinned = PinnedPublisher(p.address, "pinned").start()
    try:
        wait_for(lambda: len(pinned.accepted_list()) >= 100, 30, message="traffic before ZooKeeper goes")
        ensemble.stop()
        gone = time.monotonic()
        wait_for(lambda: pinned.closed_at is not None, 20, message="the primary fenced by its lease")
    finally:
        pinned.stop()
    settle = 0.5  # for kazoo's thread to see the connections close and tell the loop
    late = [body for body, sent, _ in pinned.accepted_list() if sent > gone + settle]
    held = [body for body, sent in pinned.sent.values() if sent > gone + settle]
    print(f"ZooKeeper gone: fenced after {pinned.closed_at - gone:.2f}s; {len(held)} publishes held, {len(late)} "
          f"accepted after {settle}s")
    assert late == []
    assert len(held) > 20  # the lease outlived the suspension: publishes came in that it used to confirm
    assert "confirmations suspended: the ZooKeeper session is suspended" in p.log()


@pytest.mark.slow
def test_sigstopped_primary_accepts_nothing_after_resume(zk_cluster):
    c = zk_cluster()
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    pinned = PinnedPublisher(p.address, "pinned").start()
    producer = Producer(c.addresses, "moving").start()
    try:
        wait_for(lambda: len(pinned.accepted_list()) >= 100 and producer.count() >= 200, 30,
                 message="traffic before the stop")
        c.sigstop(p)
        stopped = time.monotonic()
        new = c.wait_primary(timeout=c.session_timeout + 10, exclude=(p,))
        served = _first_accept_after(producer, stopped, new.address)
        time.sleep(max(0.0, stopped + 2 * c.session_timeout - time.monotonic()))  # the pinned client keeps sending
        c.sigcont(p)
        resumed = time.monotonic()
        c.wait_state(p, "backup", None, timeout=20)
        wait_for(lambda: pinned.closed_at is not None, 10, message="the old primary dropping the pinned client")
        base = producer.count()
        wait_for(lambda: producer.count() >= base + 200, 30, message="traffic after the old primary resumed")
    finally:
        pinned.stop()
        producer.stop()
    accepted = pinned.accepted_list()
    after_resume = [body for body, _, at in accepted if at >= resumed]
    sent_while_stopped = [body for body, sent, _ in accepted if sent >= stopped]
    unanswered = [body for body, sent in pinned.sent.values() if sent >= stopped]
    print(f"SIGSTOP: new primary served after {served - stopped:.2f}s; pinned client: {len(accepted)} accepted, "
          f"{len(after_resume)} of them after resume, {len(sent_while_stopped)} sent while stopped; "
          f"{len(unanswered)} sent while stopped never accepted")
    assert len(unanswered) > 50  # the old primary had publishes waiting when it resumed
    assert after_resume == [] and sent_while_stopped == []
    assert {a for t, a in producer.snapshot().values() if t > resumed} == {new.address}
    c.wait_state(p, "backup", "ready")
    assert c.primaries() == [new]
    # nothing the old primary confirmed before the stop, nor anything since, was lost
    assert set(drain([new.address], "pinned", {b for b, _, _ in accepted})) >= {b for b, _, _ in accepted}
    confirmed = set(producer.snapshot())
    assert set(drain([new.address], "moving", confirmed)) >= confirmed


@pytest.mark.slow
def test_non_ready_broker_never_wins_while_a_ready_one_exists(zk_cluster):
    c = zk_cluster(weights=[0, 0, 100])  # b2 would win every tie
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    b2 = c[2]
    if p is b2:  # b2 won the first election: make another broker the primary first
        b2.kill()
        p = c.wait_primary(exclude=(b2,), timeout=c.session_timeout + 10)
        b2.start()
        c.wait_state(b2, "backup", "ready")
    ready = next(b for b in c.brokers if b not in (p, b2))
    # b2 comes back joining (no primary to follow) just as the primary dies; `ready` stays ready
    b2.kill()
    p.kill()
    b2.start()
    assert c.status(b2)["state"] == "joining"
    died = time.monotonic()
    seen: set[str] = set()

    def watch() -> BrokerProcess | None:
        for b in (ready, b2):
            s = c.status(b)
            if s and s["role"] == "primary":
                seen.add(b.name)
        return ready if ready.name in seen else None
    wait_for(watch, c.session_timeout + 10, interval=0.05, message=f"{ready.name} elected")
    print(f"ready {ready.name} elected {time.monotonic() - died:.2f}s after the primary died")
    assert seen == {ready.name}
    c.wait_state(b2, "backup", "ready")
    assert c.primaries() == [ready]


OBSERVE = 3.0  # seconds a test watches for something that must not happen


class RoleWatch:
    """Polls every running broker's `ha` status on a thread of its own: who was ever primary, and what
    each broker said of its store while joining."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.primaries: set[str] = set()
        self.joining_freshness: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="role-watch")

    def __enter__(self) -> "RoleWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for b in self.cluster.brokers:
                s = self.cluster.status(b, timeout=1.0) if b.running else None
                if s and s["role"] == "primary":
                    self.primaries.add(b.name)
                elif s and s["state"] == "joining":
                    self.joining_freshness.setdefault(b.name, s["freshness"])
            self._stop.wait(0.05)  # the polling pace


def _epoch_file(b: BrokerProcess) -> dict:
    return json.loads((b.directory / "data" / "ha-epoch.json").read_text())


@pytest.mark.slow
def test_total_outage_comes_back_on_the_freshest_store(zk_cluster):
    """Every broker killed, then restarted stalest first, the freshest (the former primary's) seconds after
    the others: the election waits for it, never elects a staler store, and no confirmed durable message is
    lost."""
    c = zk_cluster()
    for b in c.brokers:
        b.config["ha"]["recovery_wait"] = 30  # every broker is back well within it: nobody waits that long
    c.start()
    p = c.wait_primary()
    c.wait_ready_backups(p)
    stalest, fresher = [b for b in c.brokers if b is not p]
    send_all(p.address, "q", [Message(body=i, durable=True) for i in range(100)])
    c.wait_ready(stalest, queues=["q"])
    c.kill(stalest)  # it has 0..99
    send_all(p.address, "q", [Message(body=i, durable=True) for i in range(100, 150)])
    c.wait_ready(fresher, queues=["q"])
    c.kill(fresher)  # the total outage: the ready backup, then at once the primary
    c.kill(p)
    killed = time.monotonic()
    standing = {b.name: _epoch_file(b) for b in c.brokers}
    epoch = standing[p.name]["epoch"]
    assert {n: (s["epoch"], s["standing"]) for n, s in standing.items()} == \
        {p.name: (epoch, 2), fresher.name: (epoch, 1), stalest.name: (epoch, 1)}
    with RoleWatch(c) as watch:
        for b in (stalest, fresher):
            b.start()
        # once the dead sessions' nodes are gone, the two staler brokers could elect one of them, but wait
        wait_for(lambda: set((c.status(stalest) or {}).get("zookeeper", {}).get("members", ())) ==
                 {stalest.name, fresher.name}, c.session_timeout + 10, message="the dead sessions' nodes gone")
        time.sleep(OBSERVE)  # not a synchronisation: the time during which nothing may happen
        assert watch.primaries == set()
        p.start()
        restarted = time.monotonic()
        new = c.wait_primary(timeout=c.session_timeout + 20)
        elected = time.monotonic()
        for b in (stalest, fresher):
            c.wait_ready(b, queues=["q"], timeout=30)
    print(f"total outage: the freshest broker restarted {restarted - killed:.2f}s after the kill, {new.name} "
          f"elected {elected - restarted:.2f}s after it; freshness while joining {watch.joining_freshness}")
    assert new is p and watch.primaries == {p.name}
    fresh = watch.joining_freshness  # the primary won too fast to be seen joining, but it stood highest
    assert fresh[fresher.name] > fresh[stalest.name]
    for b in c.brokers:
        assert c.bodies(b, "q") == list(range(150)), b.name
    assert [m.body for m in receive(p.address, "q", 150)] == list(range(150))


def _config(directory, zookeeper: dict) -> str:
    path = directory / "broker.yaml"
    path.write_text(yaml.safe_dump({"name": "lone", "listen": [f"127.0.0.1:{free_port()}"],
                                    "data_dir": str(directory / "data"),
                                    "ha": {"brokers": ["127.0.0.1:1"], "username": HA_USER, "password": "x",
                                           "coordinator": "zookeeper", "zookeeper": zookeeper}}))
    return str(path)


@pytest.mark.slow
def test_unreachable_zookeeper_is_a_clear_error(tmp_path):
    r = run_haqueue(["broker", "--config", _config(tmp_path, {"hosts": f"127.0.0.1:{free_port()}",
                                                              "session_timeout": 2})], timeout=60)
    assert r.returncode != 0
    assert "ZooKeeper not reachable at 127.0.0.1:" in r.stderr and "ha.zookeeper.hosts" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("setup,expected", [
    ("foreign", "not an epoch: another application's path?"),
    ("ephemeral", "NoChildrenForEphemeralsError"),
    ("read-only", "NoAuthError"),
])
def test_unusable_zookeeper_path_is_a_clear_error(tmp_path, ensemble, setup, expected):
    from kazoo.client import KazooClient
    from kazoo.security import READ_ACL_UNSAFE
    client = KazooClient(hosts=ensemble.hosts)
    client.start(timeout=10)
    try:
        if setup == "foreign":
            client.create("/foreign/epoch", b"not a number", makepath=True)
            path = "/foreign"
        elif setup == "ephemeral":
            client.create("/eph", b"", ephemeral=True)
            path = "/eph/cluster"
        else:
            client.create("/locked", b"", acl=READ_ACL_UNSAFE)
            path = "/locked/cluster"
        r = run_haqueue(["broker", "--config", _config(tmp_path, {"hosts": ensemble.hosts, "path": path})],
                        timeout=60)
    finally:
        client.stop()
        client.close()
    assert r.returncode != 0
    assert f"ZooKeeper path {path} (ha.zookeeper.path) cannot be used" in r.stderr and expected in r.stderr, r.stderr


def test_zookeeper_config_errors(tmp_path):
    r = run_haqueue(["broker", "--config", _config(tmp_path, {"hosts": "127.0.0.1:2181", "path": "relative"})])
    assert r.returncode == 2 and "ha.zookeeper.path: must be an absolute ZooKeeper path" in r.stderr
    path = tmp_path / "nozk.yaml"
    path.write_text(yaml.safe_dump({"ha": {"brokers": ["127.0.0.1:1"], "username": "ha", "password": "x",
                                           "coordinator": "zookeeper"}}))
    r = run_haqueue(["broker", "--config", str(path)])
    assert r.returncode == 2 and "ha.zookeeper: missing" in r.stderr, r.stderr
    r = run_haqueue(["broker", "--config", _config(tmp_path, {"hosts": "127.0.0.1:2181", "preferred": "yes"})])
    assert r.returncode == 2 and "ha.zookeeper.preferred: " in r.stderr, r.stderr
    r = run_haqueue(["broker", "--config", _config(tmp_path, {"hosts": "127.0.0.1:2181", "failback_delay": -1})])
    assert r.returncode == 2 and "ha.zookeeper.failback_delay: " in r.stderr, r.stderr
    quorum = yaml.safe_load(open(_config(tmp_path, {"hosts": "127.0.0.1:2181", "preferred": True})))
    quorum["ha"]["sync"] = "quorum_mem"
    path.write_text(yaml.safe_dump(quorum))
    r = run_haqueue(["broker", "--config", str(path)])
    assert r.returncode == 2 and "ha.zookeeper.preferred: needs ha.sync all or all_disk, got quorum_mem" in r.stderr, \
        r.stderr
