"""The OCF agent (agents/haqueue) on its own, with real brokers on loopback and no cluster.

- `ocf-tester` (resource-agents) runs every action, twice where it checks idempotence.
- validate-all gives OCF_ERR_CONFIGURED (6), with a reason, for bad parameters and bad configs,
  and OCF_ERR_INSTALLED (5) for what is missing on this node.
- Promotion scores: the agent's crm_attribute calls go to a fake one (HA_SBIN_DIR) that records
  them, so the tests read which score each state gave: brand-new joining 1, primary 10000, ready
  backup >= 1000, joining with a live peer none (deleted).
- After a total outage (three agent-run brokers with stores, killed, restarted stalest first):
  only the freshest store that answers scores, none while a peer is missing and the broker is
  younger than ha.recovery_wait; promote refuses a staler broker; nothing confirmed is lost.
- A SIGSTOPped broker fails the monitor within ping_timeout, and stop leaves no process behind.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from proton import Message

from ha_harness import OPS_USER, browse, receive, send_all, send_unconfirmed
from harness import BrokerProcess, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agents" / "haqueue"
BINARY = REPO / ".venv" / "bin" / "haqueue"
SHELLFUNCS = Path("/usr/lib/ocf/lib/heartbeat/ocf-shellfuncs")

OCF_SUCCESS, OCF_ERR_GENERIC, OCF_ERR_INSTALLED, OCF_ERR_CONFIGURED = 0, 1, 5, 6
OCF_NOT_RUNNING, OCF_RUNNING_PROMOTED = 7, 8

FAKE_CRM = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
exit 0
"""


@pytest.fixture(autouse=True)
def _needs_resource_agents():
    if not SHELLFUNCS.exists():
        pytest.fail("resource-agents is not installed (apt-get install resource-agents libxml2-utils; "
                    "make setup does)", pytrace=False)


class Agent:
    """Runs agents/haqueue actions with an OCF environment, as pacemaker-execd would."""

    def __init__(self, directory: Path, config: dict, **params: str) -> None:
        self.dir = directory
        self.config_path = directory / "haqueue.yaml"
        self.write_config(config)
        self.crm_log = directory / "crm.log"
        sbin = directory / "sbin"
        sbin.mkdir()
        for tool in ("crm_attribute", "crm_master"):
            (sbin / tool).write_text(FAKE_CRM.format(log=self.crm_log))
            (sbin / tool).chmod(0o755)
        self.params = {"config": str(self.config_path), "binary": str(BINARY),
                       "data_dir": str(directory / "data"), "pidfile": str(directory / "haqueue.pid"),
                       "logfile": str(directory / "broker.log"), "ping_timeout": "2", **params}
        self.env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                    "OCF_ROOT": "/usr/lib/ocf", "OCF_RA_VERSION_MAJOR": "1", "OCF_RA_VERSION_MINOR": "1",
                    "OCF_RESOURCE_INSTANCE": "haqueue:0", "OCF_RESOURCE_TYPE": "haqueue",
                    "OCF_RESKEY_CRM_meta_timeout": "20000", "OCF_RESKEY_CRM_meta_interval": "3000",
                    "OCF_RESKEY_crm_feature_set": "3.16.2", "HA_SBIN_DIR": str(sbin),
                    "HA_RSCTMP": str(directory / "rsctmp"), "HA_LOGFILE": str(directory / "agent.log")}

    def write_config(self, config: dict) -> None:
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def run(self, action: str, timeout: float = 40.0, **params: str) -> subprocess.CompletedProcess:
        env = dict(self.env)
        env.update({f"OCF_RESKEY_{k}": v for k, v in {**self.params, **params}.items()})
        return subprocess.run([str(AGENT), action], env=env, capture_output=True, text=True, timeout=timeout)

    def rc(self, action: str, **params: str) -> int:
        return self.run(action, **params).returncode

    def scores(self) -> list[str]:
        """The promotion-score calls so far, as 'v SCORE' or 'D'; clears the record."""
        try:
            lines = self.crm_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        self.crm_log.unlink()
        calls = []
        for line in lines:
            words = line.split()
            if "-D" in words:
                calls.append("D")
            elif "-v" in words:
                calls.append(f"v {words[words.index('-v') + 1]}")
        return calls

    def pid(self) -> int | None:
        try:
            return int(Path(self.params["pidfile"]).read_text())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        pid = self.pid()
        if pid is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def agents(tmp_path):
    made: list[Agent] = []

    def make(config: dict, name: str = "a", **params: str) -> Agent:
        directory = tmp_path / name
        directory.mkdir()
        agent = Agent(directory, config, **params)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.run("stop", timeout=30)
        agent.kill()
        log = agent.dir / "broker.log"
        if log.exists():
            print(f"==== {log}\n" + "\n".join(log.read_text().splitlines()[-30:]))


def ha_config(name: str, own: str, brokers: list[str], password: str, recovery_wait: float = 10) -> dict:
    # OPS_USER browses backups (the peer user may not receive: design/permissions.md)
    ops = {"password": password, "allow": {"receive": ["*"], "admin": True}}
    return {"name": name, "listen": [own], "data_dir": ".", "users": {OPS_USER: ops},
            "ha": {"brokers": brokers, "username": "ha", "password": password, "backup_timeout": 2,
                   "recovery_wait": recovery_wait}}


@pytest.mark.slow
def test_ocf_tester_passes(agents, tmp_path):
    tester = shutil.which("ocf-tester")
    if tester is None:
        pytest.fail("ocf-tester is missing: apt-get install resource-agents libxml2-utils (make setup does)")
    port = free_port()
    agent = agents(ha_config("solo", f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], secrets.token_hex(8)))
    args = [tester, "-n", "haqueue"]
    for key, value in agent.params.items():
        args += ["-o", f"{key}={value}"]
    env = {k: v for k, v in agent.env.items() if k.startswith("HA_")}
    proc = subprocess.run([*args, str(AGENT)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env}, cwd=tmp_path)
    assert proc.returncode == 0 and "passed all tests" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("params, config_change, rc, reason", [
    ({"binary": "haqueue"}, None, OCF_ERR_CONFIGURED, "binary must be an absolute path"),
    ({"config": "haqueue.yaml"}, None, OCF_ERR_CONFIGURED, "config must be an absolute path"),
    ({"ping_timeout": "soon"}, None, OCF_ERR_CONFIGURED, "ping_timeout must be a positive number"),
    ({"ping_timeout": "0"}, None, OCF_ERR_CONFIGURED, "ping_timeout must be a positive number"),
    ({"stop_timeout": "-1"}, None, OCF_ERR_CONFIGURED, "stop_timeout must be a positive whole number"),
    ({}, {"limits": {"max_depth": -1}}, OCF_ERR_CONFIGURED, "limits.max_depth"),
    ({}, {"surprise": 1}, OCF_ERR_CONFIGURED, "surprise"),
    ({}, {"ha": None}, OCF_ERR_CONFIGURED, "no ha: section"),
    ({}, {"ha.public": "127.0.0.1:5999"}, OCF_ERR_CONFIGURED, "ha.public: must not be set"),
    ({}, {"ha.coordinator": "zookeeper"}, OCF_ERR_CONFIGURED, "ha.coordinator: must be external"),
    ({"binary": "/nonexistent/haqueue"}, None, OCF_ERR_INSTALLED, "not installed"),
    ({"config": "/nonexistent/haqueue.yaml"}, None, OCF_ERR_INSTALLED, "does not exist"),
])
def test_validate_all_reports_bad_parameters(agents, params, config_change, rc, reason):
    port = free_port()
    config = ha_config("v", f"127.0.0.1:{port}", [f"127.0.0.1:{port}"], "secret")
    for key, value in (config_change or {}).items():
        if key == "ha.public":
            config["ha"]["public"] = value
        elif key == "ha.coordinator":
            config["ha"].update(coordinator=value, zookeeper={"hosts": "127.0.0.1:2181"})
        elif value is None:
            del config[key]
        else:
            config[key] = value
    agent = agents(config)
    proc = agent.run("validate-all", **params)
    assert proc.returncode == rc, proc.stderr
    assert reason in proc.stderr, proc.stderr
    # probes on a node where haqueue is not installed say "not running" rather than fail
    if rc == OCF_ERR_INSTALLED:
        assert agent.rc("monitor", CRM_meta_interval="0", **params) == OCF_NOT_RUNNING


def shard_cluster(password: str, shards: int = 1, nodes: int = 1, pacemaker: bool = True) -> dict:
    """A sharded cluster's one file on loopback, its ports free: with a pacemaker: section, as the agent runs it."""
    names = [f"n{i}" for i in range(1, nodes + 1)]
    config = {"shards": shards, "replicas": 1, "nodes": {n: {"address": "127.0.0.1"} for n in names},
              "client_port": free_port(), "peer_base": free_port(), "data_dir": ".",
              "ha": {"username": "ha", "password": password, "backup_timeout": 2, "recovery_wait": 10}}
    if pacemaker:
        config["pacemaker"] = {"node_vips": {n: "127.0.0.1" for n in names}, "shard_vips": ["127.0.0.1"] * shards,
                               "shard_port": free_port()}
    else:
        config["shard_public"] = f"127.0.0.1:{free_port()}"
    return config


@pytest.mark.parametrize("params, cluster, rc, reason", [
    ({"shard": "one"}, {}, OCF_ERR_CONFIGURED, "shard must be a shard's index (0, 1, ...) or empty, got 'one'"),
    ({"shard": "2"}, {}, OCF_ERR_CONFIGURED, "no shard 2: the shards are 0 to 1"),
    ({"shard": "0"}, {"pacemaker": False}, OCF_ERR_CONFIGURED, "no pacemaker: section (under Pacemaker the direct address of each shard is its VIP"),
    # shard 0's one replica is on n1: on n2 the instance cannot run (that node only; -INFINITY keeps it away)
    ({"shard": "0", "CRM_meta_on_node": "n2"}, {}, OCF_ERR_INSTALLED, "this node, n2, holds no replica of shard 0"),
    ({"shard": "0", "CRM_meta_on_node": "n9"}, {}, OCF_ERR_INSTALLED,
     "this node, n9, is not a node of the cluster (its nodes are n1, n2)"),
])
def test_validate_all_checks_the_shard_parameter(agents, params, cluster, rc, reason):
    agent = agents(shard_cluster("secret", shards=2, nodes=2, **cluster), CRM_meta_on_node="n1")
    proc = agent.run("validate-all", **params)
    assert proc.returncode == rc, proc.stderr
    assert reason in proc.stderr, proc.stderr


def test_with_shard_the_agent_runs_that_shards_process_of_the_cluster_file(agents):
    """The instance on node n1 (Pacemaker's name for it) of shard 0 runs `haqueue broker --config CLUSTER --node n1
    --shard 0`, which the agent monitors and promotes at the peer address the file gives it."""
    password = secrets.token_hex(8)
    agent = agents(shard_cluster(password), shard="0", CRM_meta_on_node="n1")
    assert agent.rc("start") == OCF_SUCCESS
    cmdline = Path(f"/proc/{agent.pid()}/cmdline").read_bytes().split(b"\0")
    assert cmdline[-8:-1] == [b"broker", b"--config", str(agent.config_path).encode(), b"--node", b"n1",
                              b"--shard", b"0"]
    assert agent.rc("monitor") == OCF_SUCCESS  # a backup, the freshest of a brand-new cluster
    assert agent.scores()[-1] == "v 1"
    assert agent.rc("promote") == OCF_SUCCESS
    assert agent.rc("monitor") == OCF_RUNNING_PROMOTED
    peer = yaml.safe_load(agent.config_path.read_text())["peer_base"]
    assert _ha_at(f"127.0.0.1:{peer}", password)["name"] == "n1.s0"
    assert agent.rc("stop") == OCF_SUCCESS and agent.rc("monitor") == OCF_NOT_RUNNING


def test_promotion_scores_follow_the_broker_state(agents, tmp_path):
    password = secrets.token_hex(8)
    port_a, port_b = free_port(), free_port()
    brokers = [f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"]
    # no wait for the absent b: test_total_outage_scores_only_the_freshest_store covers recovery_wait
    a = agents(ha_config("a", brokers[0], brokers, password, recovery_wait=0))
    b = BrokerProcess(tmp_path / "b", ha_config("b", brokers[1], brokers, password, recovery_wait=0), name="b")
    try:
        assert a.rc("monitor") == OCF_NOT_RUNNING
        assert a.rc("start") == OCF_SUCCESS
        assert a.scores()[-1] == "D"  # a new backup has no score until a monitor knows its state
        # brand-new cluster, no other broker up: a joining broker must be promotable
        assert a.rc("monitor") == OCF_SUCCESS
        assert a.scores() == ["v 1"]
        assert a.rc("promote") == OCF_SUCCESS
        assert a.scores() == ["v 10000"]
        assert a.rc("monitor") == OCF_RUNNING_PROMOTED
        assert a.scores() == ["v 10000"]
        # a warning on the helper's stderr (Python's, with quotes a shell cannot read) is not read as the status
        a.env["PYTHONWARNINGS"] = "always::No'Su\"ch"
        assert a.rc("monitor") == OCF_RUNNING_PROMOTED
        del a.env["PYTHONWARNINGS"]
        assert a.scores() == ["v 10000"]
        # b joins as a backup and becomes ready
        b.start()
        wait_for(lambda: _ha(b, password)["state"] == "ready", 20, message="b ready")
        # demote restarts a as a backup; b (ready) is then the live one: a, joining, gets no score
        assert a.rc("demote") == OCF_SUCCESS
        assert a.rc("monitor") == OCF_SUCCESS
        assert a.scores()[-1] == "D"
        # b promoted: a follows it and becomes ready, which ranks above 1000
        _promote(b, password)
        wait_for(lambda: a.rc("monitor") == OCF_SUCCESS and a.scores()[-1] != "D" and
                 _ha_at(brokers[0], password)["state"] == "ready", 20, message="a ready")
        assert a.rc("monitor") == OCF_SUCCESS
        score = int(a.scores()[-1].split()[1])
        assert 1000 <= score < 2000
        pid = a.pid()
        assert a.rc("stop") == OCF_SUCCESS
        assert a.scores()[-1] == "D"
        assert not _alive(pid)
        assert a.rc("monitor") == OCF_NOT_RUNNING
    finally:
        b.stop()


def _score(agent: Agent) -> str:
    """The score a monitor of this joining backup sets ('v N', or 'D' for none)."""
    assert agent.rc("monitor") == OCF_SUCCESS
    return agent.scores()[-1]


def _kill(agent: Agent) -> None:
    pid = agent.pid()
    agent.kill()
    wait_for(lambda: not _alive(pid), 10, message=f"broker {pid} gone")


def _caught_up(address: str, password: str, queue: str) -> bool:
    s = _ha_at(address, password)
    return s.get("state") == "ready" and bool(s.get("queues", {}).get(queue, {}).get("caught_up"))


@pytest.mark.slow
def test_total_outage_scores_only_the_freshest_store(agents):
    """a primary, b and c ready; c killed at 100 messages, b and a (at once) at 150; restarted c, b, then
    a seconds later. Until a is back and while younger than recovery_wait, b has no score; then b, the
    freshest that answers, scores; once a answers only a does, and c's promotion is refused."""
    password, wait = secrets.token_hex(8), 4.0
    brokers = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    a, b, c = (agents(ha_config(n, addr, brokers, password, recovery_wait=wait), name=n)
               for n, addr in zip("abc", brokers))
    for agent in (a, b, c):
        assert agent.rc("start") == OCF_SUCCESS
    assert a.rc("promote") == OCF_SUCCESS
    send_all(brokers[0], "q", [Message(body=i, durable=True) for i in range(100)])
    wait_for(lambda: _caught_up(brokers[2], password, "q"), 20, message="c caught up")
    _kill(c)
    send_all(brokers[0], "q", [Message(body=i, durable=True) for i in range(100, 150)])
    wait_for(lambda: _caught_up(brokers[1], password, "q"), 20, message="b caught up")
    _kill(b)
    _kill(a)
    for agent in (a, b, c):
        assert agent.rc("monitor") == OCF_NOT_RUNNING
    assert c.rc("start") == OCF_SUCCESS and b.rc("start") == OCF_SUCCESS
    started = time.monotonic()
    assert _ha_at(brokers[1], password)["freshness"] > _ha_at(brokers[2], password)["freshness"]
    assert _score(b) == "D"  # a does not answer and b is younger than recovery_wait
    assert _score(c) == "D"  # b is fresher
    wait_for(lambda: _score(b) == "v 1", wait + 10, interval=0.5, message="b scoring after recovery_wait")
    waited = time.monotonic() - started
    assert _score(c) == "D"
    assert a.rc("start") == OCF_SUCCESS
    assert _ha_at(brokers[0], password)["freshness"] > _ha_at(brokers[1], password)["freshness"]
    assert [_score(x) for x in (a, b, c)] == ["v 1", "D", "D"]
    proc = c.run("promote")
    assert proc.returncode == OCF_ERR_GENERIC and "fresher store" in proc.stderr, proc.stderr
    assert a.rc("promote") == OCF_SUCCESS
    print(f"b scored {waited:.1f}s after its restart (recovery_wait {wait}s)")
    for address in brokers[1:]:
        wait_for(lambda: _caught_up(address, password, "q"), 20, message=f"{address} caught up")
        assert [m.body for m in browse(address, "q", 150, user=OPS_USER, password=password)] == list(range(150))
    assert [m.body for m in receive(brokers[0], "q", 150)] == list(range(150))


@pytest.mark.slow
def test_catching_up_backups_give_way_to_the_old_primarys_fresher_store(agents):
    """a primary; b and c join and stay catching up (a test hook holds their catch-up of `stuck`); a is killed:
    b and c score nothing while a does not answer (it may come back with what they lack), and once a is back,
    joining with the freshest store, a scores and they still do not. They used to score 10, above a."""
    password = secrets.token_hex(8)
    brokers = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    a, b, c = (agents(ha_config(n, addr, brokers, password), name=n) for n, addr in zip("abc", brokers))
    a.env["HAQUEUE_TEST_HOLD_CAUGHT_UP"] = "stuck"  # haqueue/ha/test_hooks.py
    assert a.rc("start") == OCF_SUCCESS and a.rc("promote") == OCF_SUCCESS
    # a alone holds it, and its backups never catch up on it: never confirmed (the floor), but on a's disk
    assert send_unconfirmed(brokers[0], "stuck", [Message(body="held", durable=True)]) == 0
    assert b.rc("start") == OCF_SUCCESS and c.rc("start") == OCF_SUCCESS
    for address in brokers[1:]:
        wait_for(lambda: _ha_at(address, password).get("state") == "catchup", 20, message=f"{address} catching up")
    assert [_score(x) for x in (b, c)] == ["v 10", "v 10"]  # a is primary: they only rank below it
    _kill(a)
    assert [_score(x) for x in (b, c)] == ["D", "D"]
    del a.env["HAQUEUE_TEST_HOLD_CAUGHT_UP"]
    assert a.rc("start") == OCF_SUCCESS
    assert [_score(x) for x in (a, b, c)] == ["v 1", "D", "D"]
    assert a.rc("promote") == OCF_SUCCESS
    for address in brokers[1:]:
        wait_for(lambda: _caught_up(address, password, "stuck"), 20, message=f"{address} caught up")
        assert [m.body for m in browse(address, "stuck", 1, user=OPS_USER, password=password)] == ["held"]


@pytest.mark.slow
def test_hung_broker_fails_monitor_and_stop_leaves_nothing(agents):
    port = free_port()
    address = f"127.0.0.1:{port}"
    a = agents(ha_config("h", address, [address], "secret"))
    assert a.rc("start") == OCF_SUCCESS
    pid = a.pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        proc = a.run("monitor")
        assert proc.returncode == OCF_ERR_GENERIC, proc.stderr
        assert "did not answer within 2s" in proc.stderr
        # demote of the hung broker (Pacemaker's recovery) stops it at once
        assert a.rc("demote") == OCF_SUCCESS
        assert not _alive(pid)
        assert a.rc("monitor") == OCF_NOT_RUNNING
        assert a.rc("stop") == OCF_SUCCESS
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_stop_of_a_stopped_broker_sends_sigcont_and_cleans_the_pidfile(agents):
    port = free_port()
    address = f"127.0.0.1:{port}"
    a = agents(ha_config("s", address, [address], "secret"))
    assert a.rc("start") == OCF_SUCCESS
    pid = a.pid()
    os.kill(pid, signal.SIGSTOP)
    assert a.rc("stop") == OCF_SUCCESS
    assert not _alive(pid)
    assert not Path(a.params["pidfile"]).exists()
    assert a.rc("stop") == OCF_SUCCESS


def _ha_at(address: str, password: str) -> dict:
    from haqueue.admin import AdminClient, AdminError
    try:
        with AdminClient(address, 3.0, "ha", password) as client:
            return client.request("READ", "ha")[2] or {}
    except AdminError:
        return {}


def _ha(b: BrokerProcess, password: str) -> dict:
    return _ha_at(b.address, password)


def _promote(b: BrokerProcess, password: str) -> None:
    from haqueue.admin import AdminClient
    with AdminClient(b.address, 5.0, "ha", password) as client:
        code, description, _ = client.request("PROMOTE", "ha", body={"force": False})
    assert code < 400, description
