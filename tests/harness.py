"""Start real haqueue broker processes for tests.

A `BrokerProcess` writes a YAML config (from a dict) into its own directory, picks free
loopback ports when the config asks for them, runs ``python -m haqueue broker --config FILE``
as a child process with its output captured to a log file, and waits (bounded) until every
listener accepts TCP connections. It knows nothing of what the broker does once it runs, so
the HA tests can start several of them, stop, kill and restart them on the same ports and
data directory.

Ports: a listener address written as ``"127.0.0.1:0"`` (or a listener given without an
address) is replaced by a free port chosen at start time (bind port 0, close, use). The
chosen addresses stay fixed for the life of the object, so `restart()` reuses them.
"""
from __future__ import annotations

import atexit
import copy
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent

START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05


_live: set["BrokerProcess"] = set()  # every broker started, killed at interpreter exit if still running


class BrokerStartError(RuntimeError):
    """The broker process exited, or did not listen, within the start timeout."""

    def __init__(self, message: str, port_taken: bool = False):
        super().__init__(message)
        self.port_taken = port_taken


_given: set[int] = set()  # ports handed out by this process: brokers not started yet have not bound theirs


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports are picked below the kernel's ephemeral range: one from inside it may be handed to an outgoing
# connection (a peer's, a relay's) before the broker meant to listen on it binds it, and a shard's direct
# address binds only when the shard's process is promoted, seconds after the ports were picked.
PORT_RANGE = (10000, _ephemeral_low())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port below the ephemeral range that was free a moment ago on `host`, and not one handed out before:
    a cluster picks every broker's port before any binds."""
    while True:
        port = random.randrange(*PORT_RANGE)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port


def wait_for(condition: Callable[[], Any], timeout: float, interval: float = POLL_INTERVAL,
             message: str = "condition") -> Any:
    """Poll `condition` until it returns a true value, at most `timeout` seconds.

    Returns that value; raises AssertionError naming `message` on timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


def rss(pid: int) -> int:
    """The resident set size of a process, in bytes."""
    return _status_bytes(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    """The most memory a process has held (VmHWM), in bytes."""
    return _status_bytes(pid, "VmHWM")


def process_state(pid: int) -> str:
    """A process's state letter from /proc (R running, S sleeping, T stopped by a signal, Z zombie...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # after its name, which may hold ")"


def _status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def can_connect(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listening_ports(pid: int) -> set[int] | None:
    """TCP ports process `pid` listens on, from /proc (Linux); None where /proc cannot tell."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for line in f:
                        fields = line.split()
                        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            except FileNotFoundError:
                continue
        return ports
    except OSError:
        return None


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class BrokerProcess:
    """One broker as a real process, configured from a dict.

    `config` is the broker's YAML config as a dict (see design/management.md). Defaults
    filled in here: `name` (from `name`), `listen` (one free loopback port), `data_dir`
    (`<directory>/data`). Listener addresses ending in ``:0`` get a free port.

    `directory` holds ``broker.yaml``, ``broker.log`` and the data dir.
    """

    def __init__(self, directory: str | os.PathLike, config: dict | None = None,
                 name: str = "broker", extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, port_retries: int = 0):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._auto_ports: list[int] = []  # indexes of listeners whose port was chosen here
        self.config = self._resolve(copy.deepcopy(config or {}))
        # Another process may take a port between our pick and the broker's bind. With
        # `port_retries`, a first start that fails on a taken port picks new ports and tries
        # again (only for ports chosen here; never on a restart, whose ports others may know).
        self.port_retries = port_retries
        self.extra_args = list(extra_args or [])
        self.env = env
        self.config_path = self.directory / "broker.yaml"
        self.log_path = self.directory / "broker.log"
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self.starts = 0
        self.exit_expected = False  # set by stop/kill/signal: an exit the test asked for

    # ---- config -------------------------------------------------------------------------
    def _resolve(self, config: dict) -> dict:
        config.setdefault("name", self.name)
        self.name = config["name"]
        config.setdefault("data_dir", str(self.directory / "data"))
        listen = config.get("listen")
        if not listen:
            listen = ["127.0.0.1:0"]
        resolved = []
        for i, item in enumerate(listen):
            address = item if isinstance(item, str) else (item.get("address") or "127.0.0.1:0")
            if split_address(address)[1] == 0:
                self._auto_ports.append(i)
            if isinstance(item, str):
                resolved.append(self._fill_port(item))
            else:
                item = dict(item)
                item["address"] = self._fill_port(address)
                resolved.append(item)
        config["listen"] = resolved
        return config

    def _repick_ports(self) -> None:
        for i in self._auto_ports:
            item = self.config["listen"][i]
            host = split_address(item if isinstance(item, str) else item["address"])[0]
            address = f"{host}:{free_port(host)}"
            if isinstance(item, str):
                self.config["listen"][i] = address
            else:
                item["address"] = address

    @staticmethod
    def _fill_port(address: str) -> str:
        host, port = split_address(address)
        if port == 0:
            port = free_port(host)
        return f"{host}:{port}"

    @property
    def listeners(self) -> list[dict]:
        """Each listener as a dict with at least `address`, as written to the config."""
        return [{"address": item} if isinstance(item, str) else item for item in self.config["listen"]]

    @property
    def addresses(self) -> list[str]:
        return [item["address"] for item in self.listeners]

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the first listener."""
        return self.addresses[0]

    @property
    def host(self) -> str:
        return split_address(self.address)[0]

    @property
    def port(self) -> int:
        return split_address(self.address)[1]

    def url(self, index: int = 0, scheme: str = "amqp") -> str:
        return f"{scheme}://{self.addresses[index]}"

    def write_config(self) -> Path:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return self.config_path

    # ---- lifecycle ----------------------------------------------------------------------
    def command(self) -> list[str]:
        return [sys.executable, "-m", "haqueue", "broker", "--config", str(self.config_path),
                *self.extra_args]

    def start(self, wait: bool = True, timeout: float = START_TIMEOUT) -> "BrokerProcess":
        retries = self.port_retries if (self.starts == 0 and self._auto_ports and wait) else 0
        while True:
            try:
                return self._start(wait, timeout)
            except BrokerStartError as e:
                if retries <= 0 or not e.port_taken:
                    raise
                retries -= 1
                self._repick_ports()

    def _start(self, wait: bool, timeout: float) -> "BrokerProcess":
        if self.running:
            raise RuntimeError(f"broker {self.name} is already running (pid {self.proc.pid})")
        self.write_config()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.env:
            env.update(self.env)
        self._close_log()
        self.exit_expected = False
        self._log_file = open(self.log_path, "ab")
        path = f" (PYTHONPATH {self.env['PYTHONPATH']})" if self.env and "PYTHONPATH" in self.env else ""
        self._log_file.write(f"---- start #{self.starts + 1}: {' '.join(self.command())}{path}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(self.command(), cwd=self.directory, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        _live.add(self)
        if wait:
            self.wait_listening(timeout)
        return self

    def wait_listening(self, timeout: float = START_TIMEOUT) -> None:
        """Poll a TCP connect to every listener every 50 ms until all accept, at most `timeout` s."""
        deadline = time.monotonic() + timeout
        pending = [split_address(a) for a in self.addresses]
        while pending:
            if self.proc.poll() is not None:
                self.exit_expected = True  # reported here; teardown need not report it again
                self._close_log()
                log = self.log()
                raise BrokerStartError(
                    f"broker {self.name} exited with {self.proc.returncode} during start;"
                    f" log:\n{log}", port_taken="already in use" in log.lower())
            if can_connect(*pending[0], timeout=0.2):
                owned = listening_ports(self.proc.pid)
                if owned is None or pending[0][1] in owned:
                    pending.pop(0)
                    continue
                # someone else answers on that port: our broker is about to fail to bind it
            if time.monotonic() >= deadline:
                self.kill()
                raise BrokerStartError(
                    f"broker {self.name} not listening on {pending[0]} after {timeout} s;"
                    f" log:\n{self.log()}")
            time.sleep(POLL_INTERVAL)
        if self.proc.poll() is not None:  # what answered was another process on a taken port
            self.exit_expected = True
            self._close_log()
            log = self.log()
            raise BrokerStartError(f"broker {self.name} exited with {self.proc.returncode} during start;"
                                   f" log:\n{log}", port_taken="already in use" in log.lower())

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    @property
    def exited_unasked(self) -> bool:
        """The process exited without the test asking for it (stop, kill, signal): a crash."""
        return self.proc is not None and self.proc.poll() is not None and not self.exit_expected

    def signal(self, sig: int) -> None:
        self.exit_expected = True
        if self.running:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait (bounded) for the process to exit; returns its exit code."""
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait up to `timeout` s, then SIGKILL. Returns the exit code (None if never started)."""
        if self.proc is None:
            return None
        self.exit_expected = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._append_log(f"---- did not exit {timeout} s after SIGTERM: SIGKILL\n")
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._close_log()
        return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL and reap. Returns the exit code."""
        if self.proc is None:
            return None
        self.exit_expected = True
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)
        self._close_log()
        return self.proc.returncode

    def restart(self, timeout: float = START_TIMEOUT) -> "BrokerProcess":
        """Stop (if running) and start again with the same config, ports and data dir."""
        self.stop()
        return self.start(timeout=timeout)

    # ---- log ----------------------------------------------------------------------------
    def log(self) -> str:
        """The broker's output so far (all starts), as text."""
        if self._log_file:
            self._log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _append_log(self, text: str) -> None:
        if self._log_file:
            self._log_file.write(text.encode())
            self._log_file.flush()

    def _close_log(self) -> None:
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "BrokerProcess":
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.returncode}" if self.proc else "new"
        return f"<BrokerProcess {self.name} {self.addresses} {state}>"


def unexpected_exits(brokers: Iterable[BrokerProcess]) -> list[str]:
    """One line per broker that exited without the test asking for it (see `exited_unasked`)."""
    return [f"{b.name} exited with {b.proc.returncode} during the test" for b in brokers if b.exited_unasked]


@atexit.register
def _kill_leftovers() -> None:
    """No broker outlives the test run, even when a test or pytest itself was interrupted."""
    for b in list(_live):
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()


def run_haqueue(args: list[str], timeout: float = 30.0, input: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m haqueue ARGS`` to completion (bounded); returns the CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "haqueue", *args], capture_output=True, text=True,
                          timeout=timeout, input=input, env=full_env, cwd=REPO_ROOT)
