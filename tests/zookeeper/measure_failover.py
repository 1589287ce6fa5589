"""Failover times under ZooKeeper, for bench/RESULTS.md: `python tests/zookeeper/measure_failover.py
[--runs N] [--session-timeout S ...]`. For each session timeout: a 3-server ensemble, three brokers,
a producer moving between them; N times: kill -9 the primary, time until the new primary accepts a
publish, restart the old one as a backup and wait until it is ready. Prints one line per run and a
summary; checks that no confirmed message was lost.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TESTS / "zookeeper"), str(TESTS), str(TESTS / "ha")]

from harness import wait_for  # noqa: E402
from zk_cluster import Producer, ZkCluster, drain  # noqa: E402
from zk_harness import Ensemble  # noqa: E402


def measure(session_timeout: float, runs: int, directory: Path) -> list[float]:
    ensemble = Ensemble(directory / "zookeeper").start()
    cluster = ZkCluster(directory / "brokers", ensemble.hosts, session_timeout=session_timeout)
    times = []
    try:
        cluster.start()
        primary = cluster.wait_primary()
        cluster.wait_ready_backups(primary)
        producer = Producer(cluster.addresses, "failover").start()
        for run in range(runs):
            base = producer.count()
            wait_for(lambda: producer.count() >= base + 300, 30, message="traffic before the kill")
            killed = time.monotonic()
            primary.kill()
            new = cluster.wait_primary(timeout=session_timeout + 10, exclude=(primary,))
            served = wait_for(lambda: min((t for t, a in producer.snapshot().values()
                                           if t > killed and a == new.address), default=None), 30,
                              message="a publish accepted by the new primary")
            times.append(served - killed)
            print(f"session_timeout {session_timeout:g}s run {run + 1}: {primary.name} killed, {new.name} "
                  f"accepted a publish after {served - killed:.2f}s", flush=True)
            primary.start()
            cluster.wait_state(primary, "backup", "ready")
            primary = new
        producer.stop()
        confirmed = set(producer.snapshot())
        got = set(drain([primary.address], "failover", confirmed, timeout=120))
        print(f"session_timeout {session_timeout:g}s: {len(confirmed)} confirmed, lost {len(confirmed - got)}",
              flush=True)
    finally:
        cluster.shutdown()
        ensemble.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--session-timeout", type=float, nargs="+", default=[2.0, 4.0])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        for timeout in args.session_timeout:
            times = measure(timeout, args.runs, Path(directory) / f"t{timeout:g}")
            print(f"SUMMARY session_timeout {timeout:g}s: kill -9 -> new primary accepts: min {min(times):.2f}s "
                  f"median {statistics.median(times):.2f}s max {max(times):.2f}s over {len(times)} runs", flush=True)


if __name__ == "__main__":
    main()
