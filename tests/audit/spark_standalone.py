"""A Spark standalone cluster from the pyspark package itself (`spark-class ...Master` / `...Worker`, SPARK_HOME
the package's directory): a master on 127.0.0.1 and one-core workers, each on a loopback address of its own
(127.0.0.2, 127.0.0.3...: Spark takes them for two machines, as it must, or it reads shuffle blocks of one
host's executors straight from the other's disk) and in a mount namespace of its own (`unshare`, as root) in
which the directories `hidden` names (pytest's temporary ones) are empty file systems (tmpfs), `root` bound
back at its own path should it be inside one: a worker sees `root/shared`, standing for a share (NFS)
mounted on every node at the same path, and nothing of the brokers' or the driver's own directories.

Every process is started in a process group of its own (a worker's executors are in its group), and
`stop` ends those groups: no JVM is left behind.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from harness import free_port, wait_for
from spark_archive import jvm_options

# The namespace of a worker: `root` kept through a bind mount moved back after the tmpfs mounts.
_NAMESPACE = """set -e
root=$1; shift
mount --bind "$root" /mnt
while [ "$1" != -- ]; do mount -t tmpfs tmpfs "$1"; shift; done; shift
mkdir -p "$root"
mount --move /mnt "$root"
exec "$@"
"""


class StandaloneCluster:
    def __init__(self, hidden: list[str], workers: int = 2) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.spark_class = str(self.home / "bin" / "spark-class")
        self.root = Path(tempfile.mkdtemp(prefix="haqueue-standalone-"))
        self.shared = self.root / "shared"
        self.shared.mkdir()
        self.hidden = hidden
        self.workers = [f"127.0.0.{2 + i}" for i in range(workers)]
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        # The tests' JVM options: the daemons and the executors run on the driver's class path, so they map its
        # class archive too.
        self.jvm_options = jvm_options()
        # What a driver of this cluster is given: its own address on the loopback, and the executors' JVM options.
        self.conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                     "spark.executor.extraJavaOptions": self.jvm_options, "spark.ui.enabled": "false"}

    def _start(self, name: str, command: list[str], host: str, **env: str) -> None:
        log = open(self.root / f"{name}.log", "wb")
        environment = dict(os.environ, SPARK_HOME=str(self.home), SPARK_LOCAL_IP=host, SPARK_DAEMON_MEMORY="256m",
                           SPARK_DAEMON_JAVA_OPTS=self.jvm_options, **env)
        environment.pop("PYSPARK_SUBMIT_ARGS", None)
        self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                               start_new_session=True))
        log.close()

    def start(self) -> StandaloneCluster:
        """Start the master; `wait` for it, then the workers."""
        self._start("master", [self.spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)], "127.0.0.1",
                    SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        return self

    def wait(self) -> StandaloneCluster:
        wait_for(lambda: self._status().get("status") == "ALIVE", 60, interval=0.2, message="the Spark master")
        for i, host in enumerate(self.workers, start=1):
            work = self.root / f"worker-{i}"
            self._start(f"worker-{i}", ["unshare", "--mount", "--propagation", "private", "sh", "-c", _NAMESPACE, "sh",
                                        str(self.root), *self.hidden, "--", self.spark_class,
                                        "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
                                        "--memory", "1g", "--work-dir", str(work), "--webui-port", "0", self.url], host)
        wait_for(lambda: self._status().get("aliveworkers") == len(self.workers), 60, interval=0.2,
                 message=f"{len(self.workers)} Spark workers")
        return self

    def _status(self) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
                return json.load(answer)
        except (OSError, ValueError):  # not up yet
            return {}

    def last_application(self) -> str:
        apps = self._status()["completedapps"] + self._status()["activeapps"]
        return max(apps, key=lambda app: app["starttime"])["id"]

    def hosts_that_ran_tasks(self, application: str) -> set[str]:
        """The workers whose executors of `application` finished tasks (their logs say so)."""
        return {host for i, host in enumerate(self.workers, start=1)
                if any("Finished task" in log.read_text(errors="replace")
                       for log in (self.root / f"worker-{i}" / application).glob("*/stderr"))}

    def logs(self) -> str:
        return "\n".join(f"==== {log} ====\n" + log.read_text(errors="replace")[-3000:]
                         for log in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        for process in reversed(self.processes):  # the workers (and their executors), then the master
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # what is left of its group (an executor)
            except ProcessLookupError:
                pass
            process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def hidden_from_workers(base_temp: Path) -> list[str]:
    """pytest's base temporary directory, where the brokers' and the driver's directories are; not all of /tmp,
    which may hold the clone and its virtualenv (SPARK_HOME: a CI clone in /tmp hid the workers' own JVM)."""
    return [str(base_temp.resolve())]
