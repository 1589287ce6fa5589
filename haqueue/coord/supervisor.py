"""The local supervisor (`haqueue cluster up`): N brokers on one machine as a hot-standby cluster.

It promotes the first broker of a new cluster, or the broker with the freshest store of one that
was stopped or killed whole (design/store.md), then watches: when the primary's process dies or
stops answering, it kills what is left of it (fencing, as Pacemaker's stop would), promotes the
most up-to-date ready backup, and once that one is active restarts the dead broker as a backup. With no
ready backup left (every broker went down), it restarts them all at once and promotes the freshest store
again. The public
address is a listener only the primary binds, so it moves with the role exactly as a virtual IP
does.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from ..admin import AdminClient, AdminError
from ..config import TlsConfig, broker_config
from .liveness import Liveness, cpu_seconds
from .up_config import NO_FILE, broker_audit

log = logging.getLogger("haqueue.cluster")


class KilledStarting(AdminError):
    """A broker killed by a signal before it answered: started again, up to KILLED_STARTS times in a row."""


CHECK_INTERVAL = 0.2  # seconds between looks at the primary
PING_TIMEOUT = 1.0  # a primary that does not answer in this long, twice, is declared hung
PROMOTE_TIMEOUT = 30.0  # seconds to keep asking before saying a promotion is stuck
START_GRACE = 15.0  # seconds a starting broker may leave the supervisor unanswered while using no CPU
START_TIMEOUT = 300.0  # ... and while using CPU (recovering a store of 10,000 queues on a busy machine)
# Starts in a row of a broker killed by a signal before it answered (kill -9 from outside, the OOM killer): it is
# started again, not the cluster stopped for it; one that exits by itself (a bad config, a store it cannot open) is not.
KILLED_STARTS = 3
HA_USER = "ha"


def write_private_yaml(directory: str, name: str, config: dict[str, Any]) -> str:
    """Write a config (it holds the ha password) readable by its owner only; its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)
    return path


@dataclass
class Member:
    name: str
    address: tuple[str, int]  # where the supervisor reaches it (its peer listener)
    args: list[str]  # of `haqueue broker`
    log_path: str
    console: str | None = None  # its web console's URL, if it serves one
    process: subprocess.Popen[bytes] | None = None
    log_file: Any = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"


class Supervisor:
    """One HA group's processes: starts them, promotes one, and fails over when the primary dies."""

    def __init__(self, members: list[Member], username: str, password: str, tls: TlsConfig | None = None) -> None:
        self.members = members
        self.username, self.password = username, password
        self.tls = tls  # ha.tls: the brokers' peer listeners take TLS only
        self.primary: Member | None = None
        self._stopping = False
        self._ping_client: AdminClient | None = None
        self._ping_target: Member | None = None
        self._liveness: Liveness | None = None  # the primary's: busy or hung when it does not answer

    @classmethod
    def local(cls, size: int, directory: str, public: tuple[str, int], base_port: int, host: str = "127.0.0.1",
              backup_timeout: float = 5.0, extra: dict[str, Any] | None = None,
              console_port: int | None = None, origin: str = NO_FILE) -> "Supervisor":
        """`size` brokers on `host`, broker i listening on base_port + i, sharing `public`; with `console_port`,
        broker i serves its web console on console_port + i. `extra`: the config every broker starts from
        (up_config.py); each broker's is checked as the broker checks it before any is written (ConfigError naming
        `origin`, where `extra` came from)."""
        directory = os.path.abspath(directory)
        password = secrets.token_hex(16)
        extra = extra or {}
        ha = {"brokers": [f"{host}:{base_port + j}" for j in range(size)], "public": f"{public[0]}:{public[1]}",
              "username": HA_USER, "password": password, "backup_timeout": backup_timeout, **extra.get("ha", {})}
        configs = []
        for i in range(size):
            config = {**extra, "name": f"broker-{i}", "listen": [f"{host}:{base_port + i}"],
                      "data_dir": os.path.join(directory, f"broker-{i}"), "ha": ha,
                      **broker_audit(extra, f"broker-{i}")}
            if console_port:
                config["http"] = {**extra.get("http", {}), "listen": f"{host}:{console_port + i}"}
            configs.append(config)
        checked = [broker_config(config, origin) for config in configs]
        members = []
        for i, config in enumerate(configs):
            name = config["name"]
            path = write_private_yaml(directory, f"{name}.yaml", config)
            members.append(Member(name, (host, base_port + i), ["--config", path], os.path.join(directory, f"{name}.log"),
                                  f"http://{host}:{console_port + i}/" if console_port else None))
        return cls(members, HA_USER, password, checked[0].ha.tls if checked[0].ha else None)

    def admin(self, member: Member, timeout: float = 5.0) -> AdminClient:
        return AdminClient(member.endpoint, timeout, self.username, self.password, self.tls)

    def request(self, member: Member, operation: str, type_: str, body: dict | None = None,
                timeout: float = 5.0) -> Any:
        with self.admin(member, timeout) as client:
            code, description, answer = client.request(operation, type_, body=body)
        if code >= 400:
            raise AdminError(f"{member.name}: {description}")
        return answer

    # -- processes -----------------------------------------------------------------------------
    def start(self, member: Member) -> None:
        self.start_all([member])

    def start_all(self, members: list[Member]) -> None:
        """Start each broker, then wait for each to answer: they recover their stores at once (after a total
        outage at 10,000 queues, one after another took as long as the three recoveries together)."""
        for member in members:
            self._spawn(member)
        for member in members:
            for start in range(1, KILLED_STARTS + 1):
                try:
                    self.wait_answering(member)
                    break
                except KilledStarting as e:
                    if start == KILLED_STARTS or self._stopping:
                        raise
                    log.warning("%s; starting it again", e)
                    self.kill(member)
                    self._spawn(member)

    def _spawn(self, member: Member) -> None:
        member.log_file = open(member.log_path, "ab")
        member.process = subprocess.Popen([sys.executable, "-m", "haqueue", "broker", *member.args],
                                          stdout=member.log_file, stderr=member.log_file)

    def wait_answering(self, member: Member) -> None:
        """Until the broker answers; an error if it exits, or leaves START_GRACE seconds unanswered without using
        CPU (hung) or START_TIMEOUT seconds whatever it does. A broker recovering its store keeps using CPU: at
        10,000 queues on a loaded machine that took over 15 s, and the whole cluster was stopped for it."""
        assert member.process is not None
        pid = member.process.pid
        started = time.monotonic()
        idle_deadline, cpu = started + START_GRACE, cpu_seconds(pid)
        while True:
            try:
                self.request(member, "READ", "broker", timeout=1.0)
                return
            except AdminError:
                code = member.process.poll()
                if code is not None and code < 0:
                    raise KilledStarting(f"{member.name} was killed by signal {-code} while starting")
                if code is not None:
                    raise AdminError(f"{member.name} exited with {code}; see {member.log_path}")
                now = time.monotonic()
                if now > idle_deadline:
                    used = cpu_seconds(pid)
                    working = used is not None and cpu is not None and used > cpu
                    if not working or now - started > START_TIMEOUT:
                        why = "" if working else f", using no CPU for {START_GRACE:g} s"
                        raise AdminError(f"{member.name} did not answer within {now - started:.0f} s{why}; "
                                         f"see {member.log_path}") from None
                    idle_deadline, cpu = now + START_GRACE, used
                time.sleep(0.05)  # polling a process that is starting, bounded by the deadlines

    def kill(self, member: Member) -> None:
        if member.process is not None and member.process.poll() is None:
            member.process.kill()
            member.process.wait()
        if member.log_file is not None:
            member.log_file.close()
            member.log_file = None

    # -- roles ---------------------------------------------------------------------------------
    def up(self) -> None:
        self.start_all(self.members)
        self.promote_freshest()

    def promote_freshest(self) -> None:
        """Promote the first broker of a brand-new cluster, else the one whose store is freshest ("latest
        update wins"); a broker refuses while it has not met every peer, so ask again until it agrees."""
        deadline = time.monotonic() + PROMOTE_TIMEOUT
        while not self._stopping:
            candidate = self.freshest()
            try:
                self.promote(candidate)
                return
            except AdminError as e:
                if time.monotonic() > deadline:
                    log.error("%s; still trying", e)
                    deadline = time.monotonic() + PROMOTE_TIMEOUT
            time.sleep(CHECK_INTERVAL)  # bounded retry while the brokers meet each other

    def freshest(self) -> Member:
        statuses: dict[str, dict[str, Any]] = {}
        for member in self.members:
            try:
                statuses[member.name] = self.request(member, "READ", "ha", timeout=PING_TIMEOUT)
            except AdminError:
                continue
        if all(int(s.get("epoch", 0)) == 0 for s in statuses.values()):
            return self.members[0]
        best = max((m for m in self.members if m.name in statuses),
                   key=lambda m: tuple(statuses[m.name].get("freshness", ())))
        log.info("%s has the freshest store (%s)", best.name,
                 ", ".join(f"{name} {s.get('freshness')}" for name, s in statuses.items()))
        return best

    def promote(self, member: Member) -> None:
        self.request(member, "PROMOTE", "ha", {"force": False})
        self.primary = member
        self._liveness = Liveness(member.process.pid, member.name) if member.process is not None else None
        log.info("%s is primary", member.name)

    def _healthy(self, member: Member) -> bool:
        """Alive and answering, or busy (using CPU) for less than liveness.BUSY_GRACE; one connection is kept
        open to the primary for these pings."""
        if member.process is None or member.process.poll() is not None:
            return False
        for _ in range(2):
            try:
                if self._ping_client is None or self._ping_target is not member:
                    self._close_ping()
                    self._ping_client, self._ping_target = self.admin(member, PING_TIMEOUT), member
                code, _, _ = self._ping_client.request("READ", "broker")
                if self._liveness is not None:
                    self._liveness.answered()
                return code < 400
            except AdminError:
                self._close_ping()
        return self._liveness is not None and self._liveness.busy()

    def _close_ping(self) -> None:
        if self._ping_client is not None:
            self._ping_client.close()
        self._ping_client = self._ping_target = None

    def best_backup(self) -> Member | None:
        """The ready backup that has applied the most of the old primary's stream."""
        best, best_applied = None, -1
        for member in self.members:
            if member is self.primary or member.process is None or member.process.poll() is not None:
                continue
            try:
                status = self.request(member, "READ", "ha", timeout=PING_TIMEOUT)
            except AdminError:
                continue
            if status.get("role") == "backup" and status.get("state") == "ready" and status["applied"] > best_applied:
                best, best_applied = member, status["applied"]
        return best

    def failover(self) -> None:
        failed = self.primary
        assert failed is not None
        log.warning("primary %s failed; promoting a ready backup", failed.name)
        self.kill(failed)
        candidate = self.best_backup()
        if candidate is not None:
            try:
                self.promote(candidate)
                self.wait_active(candidate)
                log.info("restarting %s as a backup", failed.name)
                self.start(failed)
                return
            except AdminError as e:
                log.warning("promotion of %s refused: %s", candidate.name, e)
        # No ready backup: none can become ready without a primary. Bring every broker back with its
        # store and promote the freshest, as after a total outage.
        log.warning("no ready backup; restarting the brokers that are down and promoting the freshest store")
        self.primary = None
        down = [member for member in self.members if member.process is None or member.process.poll() is not None]
        for member in down:
            self.kill(member)
        self.start_all(down)
        self.promote_freshest()

    def wait_active(self, member: Member) -> None:
        """Until the new primary is active (the backups ready under the old one are ready again, or its
        ha.backup_timeout passed), or dies or stops answering (the watch's to see). The failed broker's restart
        waits for it: on one machine, its recovery and catch-up took the cores from the backups' re-subscription,
        which a publish waits for (at 10,000 queues, seconds)."""
        deadline = time.monotonic() + PROMOTE_TIMEOUT
        while not self._stopping and time.monotonic() < deadline:
            try:
                if self.request(member, "READ", "ha", timeout=PING_TIMEOUT).get("state") != "recovering":
                    return
            except AdminError:
                return
            time.sleep(CHECK_INTERVAL)  # the supervisor's pace, bounded by the deadline

    def watch(self) -> None:
        while not self._stopping:
            if self.primary is not None and not self._healthy(self.primary):
                if self._stopping:
                    break
                self.failover()
            for member in self.members:
                if member is not self.primary and member.process is not None and member.process.poll() is not None \
                        and not self._stopping:
                    log.warning("backup %s exited (%s); restarting it", member.name, member.process.returncode)
                    self.kill(member)
                    self.start(member)
            self._pause()

    def _pause(self) -> None:
        """CHECK_INTERVAL, the supervisor's own pace, cut short when the primary's process exits: a killed
        primary is seen at once, not at the next look."""
        process = self.primary.process if self.primary is not None else None
        if process is None:
            time.sleep(CHECK_INTERVAL)
            return
        try:
            process.wait(CHECK_INTERVAL)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        self._stopping = True

    def down(self) -> None:
        self._close_ping()
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait()
            self.kill(member)


def cluster_up(size: int, directory: str, public: tuple[str, int], base_port: int,
               extra: dict[str, Any] | None = None, console_port: int | None = None, origin: str = NO_FILE) -> int:
    """`extra`: the config every broker starts from (up_config.py: `--config` and the options), read from `origin`;
    its `ha` and `http` keys go into those sections. `console_port`: broker i serves its web console on
    console_port + i. A config the brokers would refuse raises ConfigError before any starts."""
    supervisor = Supervisor.local(size, directory, public, base_port, extra=extra, console_port=console_port,
                                  origin=origin)

    def report() -> None:
        print_members(supervisor)
        print(f"public {public[0]}:{public[1]}", flush=True)
    return supervise([supervisor], report)


def print_members(supervisor: Supervisor) -> None:
    for member in supervisor.members:
        role = "primary" if member is supervisor.primary else "backup"
        print(f"{member.name} {member.endpoint} {role} (log {member.log_path})", flush=True)
    for member in supervisor.members:
        if member.console is not None:
            print(f"console {member.console} {member.name}", flush=True)


def supervise(supervisors: list[Supervisor], report: Callable[[], None]) -> int:
    """Bring every group up, `report`, then watch each on its own thread (one group's failover never waits
    for another's) until SIGINT or SIGTERM; every broker is stopped at the end. The groups come up one
    after another on this thread: proton's cffi module completes its C types on first use, and threads
    doing that at once failed (`pn_atom_t: wrong size for field 'u'`)."""
    logging.getLogger("proton").setLevel(logging.WARNING)  # it logs every admin connection at INFO
    failures: list[AdminError] = []

    def stop_all(*_: Any) -> None:
        for supervisor in supervisors:
            supervisor.stop()

    def watch(supervisor: Supervisor) -> None:
        try:
            supervisor.watch()
        except AdminError as e:  # a broker that will not start again: the whole cluster stops
            failures.append(e)
            stop_all()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_all)
    try:
        for supervisor in supervisors:
            supervisor.up()
        report()
        threads = [threading.Thread(target=watch, args=(supervisor,), daemon=True) for supervisor in supervisors]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(CHECK_INTERVAL)  # the main thread stays free for signals
    except AdminError as e:
        failures.append(e)
    finally:
        for supervisor in supervisors:
            supervisor.down()
    for failure in failures:
        log.error("%s", failure)
    return 1 if failures else 0
