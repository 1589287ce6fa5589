"""A sharded haqueue set-up for the benchmarks (design/sharding.md, step 7): `haqueue cluster up --size 1
--shards K --replicas 1`, K shard processes on this machine, each its own primary. Queues used at once are
spread one per shard (names chosen by the ownership hash), and each client connects to the direct address
of its queue's shard, or with `relay` to the next shard's, so that every link goes through that process's
relay: the relay's cost per message is the difference between the two."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import setups as S
import run as R
import yaml
from haqueue.admin import AdminError
from haqueue.shard.ownership import shard_of_name

HOST = R.HOST


class ShardedCluster(R.LoggedProcess, R.Broker):
    def __init__(self, label: str, shards: int, relay: bool = False):
        self.label = label
        self.shards = shards
        self.relay = relay
        self.pairs = shards  # a saturation run uses one queue per shard
        self.dir = tempfile.mkdtemp(prefix="haqueue-shbench-")
        self.port = S.free_ports(1)[0]  # the node's client address, shared by its shard processes
        self.base = S.free_ports(2 * shards, consecutive=True)[0]  # peer listeners, then direct addresses
        R.OUT.mkdir(exist_ok=True)
        self.log_path = R.OUT / f"shards-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self.cmd = [str(S.VENV_PY), "-m", "haqueue", "cluster", "up", "--size", "1", "--shards", str(shards),
                    "--replicas", "1", "--dir", self.dir, "--public", f"{HOST}:{self.port}",
                    "--base-port", str(self.base), "--console-port", "0"]  # the brokers alone, as setups.py's
        self.proc: subprocess.Popen | None = None
        self.password = ""
        self.addresses: dict[str, str] = {}  # queue -> the name used for it, owned by the shard it was given

    def command(self) -> str:
        return " ".join(self.cmd)

    def start(self) -> None:
        R.log(f"starting {self.label}: {self.command()}")
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=S.REPO, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60 + 10 * self.shards
        while "nodes " not in self.log_tail(5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.label} not up; log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.2)
        self.password = yaml.safe_load(Path(self.dir, "cluster.yaml").read_text())["ha"]["password"]
        R.log(f"{self.label}: {self.shards} shard processes, pids {self.members()}")

    def members(self) -> dict[str, int]:
        """shard process name (n1.s<i>) -> pid."""
        out = {}
        for pid in R.proc_tree(self.pid):
            found = re.search(r"--shard (\d+)", S.cmdline(pid))
            if found and S.pid_alive(pid):
                out[f"n1.s{found.group(1)}"] = pid
        return out

    def spread(self, queues: list[str]) -> list[str]:
        return [self._owned_by(queue, i % self.shards) for i, queue in enumerate(queues)]

    def address(self, queue: str) -> str:
        return self._owned_by(queue, 0)

    def _owned_by(self, queue: str, shard: int) -> str:
        """A name beginning with `queue` that shard `shard` owns (remembered, for drop_queue)."""
        n = 0
        while shard_of_name(f"{queue}.{n}", self.shards) != shard:
            n += 1
        self.addresses[queue] = name = f"{queue}.{n}"
        return name

    def direct(self, shard: int) -> int:
        return self.base + self.shards + shard

    def port_for(self, address: str) -> int:
        owner = shard_of_name(address, self.shards)
        return self.direct((owner + 1) % self.shards if self.relay else owner)

    def drop_queue(self, queue: str) -> None:
        name = self.addresses.pop(queue, queue)
        try:
            code, desc, _ = R.admin_request(f"{HOST}:{self.direct(shard_of_name(name, self.shards))}",
                                            "DELETE", "queue", name)
            if code >= 400:
                R.log(f"could not delete queue {name}: {code} {desc}")
        except AdminError as e:
            R.log(f"could not delete queue {name}: {e}")

    def cpu_groups(self) -> list:
        return [(name, pid, True) for name, pid in sorted(self.members().items())] + [("supervisor", self.pid, False)]

    def counters(self) -> dict[str, int]:
        return R.store_syncs([f"{HOST}:{self.base + i}" for i in range(self.shards)], self.password)

    def describe_failure(self) -> str:
        return f"log {self.log_path} tail: " + " / ".join(self.log_tail(8).splitlines())

    def stop(self) -> None:
        if self.proc is not None:
            S.terminate_group(self.proc, self.label)
            self.logf.close()
        shutil.rmtree(self.dir, ignore_errors=True)
