"""A real ZooKeeper ensemble for tests: Debian's `zookeeper` jar run with `java` directly.

`Ensemble(directory, size=3)` writes one `zoo.cfg` and data dir (with its `myid`) per server, on
loopback ports chosen free at start (client, peer and election port each), `tickTime=500`. Every
server runs in its own session (process group) so a test can SIGKILL one; `stop()` kills them
all and is safe to call twice. Every wait polls a condition with a deadline.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from harness import free_port, wait_for

JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
# A test's server starts, elects and serves a few clients for seconds: C1 alone and the serial collector start it on
# less CPU than the JIT's and G1's threads take (the machine is the tests' too).
JAVA = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
TICK_MS = 500
SERVING_TIMEOUT = 30.0


def available() -> str | None:
    """Why a ZooKeeper ensemble cannot run here, or None."""
    if shutil.which("java") is None:
        return "no java (make setup installs default-jre-headless)"
    missing = [j for j in JARS if not os.path.exists(j)]
    return f"missing {', '.join(missing)} (make setup installs zookeeper)" if missing else None


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """A ZooKeeper four-letter-word answer, or "" if the server does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class Server:
    def __init__(self, directory: Path, myid: int) -> None:
        self.myid = myid
        self.directory = directory
        self.client_port, self.peer_port, self.election_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = directory / "zookeeper.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def mode(self) -> str | None:
        """leader, follower or standalone while serving; None otherwise."""
        for line in four_letter(self.client_port, "srvr").splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, servers: list["Server"]) -> None:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{self.myid}\n")
        config = [f"tickTime={TICK_MS}", "initLimit=10", "syncLimit=5", f"dataDir={data}",
                  f"clientPort={self.client_port}", "clientPortAddress=127.0.0.1", "admin.enableServer=false",
                  "4lw.commands.whitelist=ruok,srvr,stat,mntr", "maxClientCnxns=0"]
        if len(servers) > 1:
            config += [f"server.{s.myid}=127.0.0.1:{s.peer_port}:{s.election_port}" for s in servers]
        cfg = self.directory / "zoo.cfg"
        cfg.write_text("\n".join(config) + "\n")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*JAVA, "-cp", ":".join(JARS),
                                          "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class Ensemble:
    def __init__(self, directory: Path, size: int = 3) -> None:
        self.servers = [Server(Path(directory) / f"zk{i + 1}", i + 1) for i in range(size)]

    @property
    def hosts(self) -> str:
        return ",".join(s.address for s in self.servers)

    def start(self) -> "Ensemble":
        for s in self.servers:
            s.start(self.servers)
        self.wait_serving()
        return self

    def wait_serving(self, timeout: float = SERVING_TIMEOUT) -> None:
        """Every running server serves, one of them as leader (or standalone)."""
        def ok() -> bool:
            modes = [s.mode() for s in self.servers if s.running]
            return all(modes) and any(m in ("leader", "standalone") for m in modes)
        wait_for(ok, timeout, interval=0.1, message=f"ZooKeeper serving ({self.modes()})")

    def modes(self) -> dict[int, str | None]:
        return {s.myid: s.mode() if s.running else "down" for s in self.servers}

    def leader(self) -> Server:
        return wait_for(lambda: next((s for s in self.servers if s.running and s.mode() == "leader"), None),
                        15, interval=0.1, message="a ZooKeeper leader")

    def stop(self) -> None:
        for s in self.servers:
            s.kill()

    def log_tails(self, lines: int = 20) -> str:
        out = []
        for s in self.servers:
            text = s.log_path.read_text(errors="replace") if s.log_path.exists() else ""
            out.append(f"==== zookeeper {s.myid} ({s.log_path}) ====\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)
