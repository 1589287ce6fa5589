"""The queue core's Python cost per message, without sockets: enqueue, dispatch and dequeue of 100-byte
transient messages on one queue, in this tree or another (a `git archive` of an older commit).

    .venv/bin/python bench/queue_core.py [TREE ...]      # default: this tree; best of 5 runs of 200,000
    .venv/bin/python bench/queue_core.py --keep-local [TREE ...]   # the queue as an HA primary's (below)

Each tree runs in its own process (its `haqueue` imported from the tree), so trees compare side by side.
With --keep-local the queue is one whose messages an HA primary replicates: each enqueue asks whether the
message stays on the primary (`x-replicate: false`, design/replication.md), in a tree that has the check.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
# header (durable = false), properties, a 100-byte data body
MESSAGE = b"\x00\x53\x70\xc0\x02\x01\x42" + b"\x00\x53\x75\xa0\x64" + b"x" * 100


class _Consumer:
    browse = False
    cursor = 0
    selector = None

    def __init__(self) -> None:
        self.got: list = []

    def credit(self) -> int:
        return 1 << 30

    def deliver(self, entry) -> None:
        self.got.append(entry)

    def after_dispatch(self) -> None:
        pass

    def queue_deleted(self) -> None:
        pass


def measure(keep_local: bool, n: int = 200_000, runs: int = 5) -> float:
    """Best µs per message over `runs` rounds of n (the haqueue on sys.path)."""
    from haqueue.broker.queue import Queue
    queue = Queue("q", {}, "uid", lambda q: None)
    if keep_local and hasattr(queue, "keep_local_where"):
        from haqueue.broker.message import unreplicated
        queue.keep_local_where(unreplicated)
    consumer = _Consumer()
    queue.subscribe(consumer)
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(n):
            queue.enqueue(MESSAGE, 0.0)
        queue.dispatch()
        for entry in consumer.got:
            queue.dequeue(entry)
        consumer.got.clear()
        best = min(best, (time.perf_counter() - started) / n * 1e6)
    return best


def main(argv: list[str]) -> int:
    if argv[:1] == ["--run"]:
        sys.path.insert(0, argv[1])
        print(f"{measure(argv[2:] == ['--keep-local']):.2f}")
        return 0
    keep_local = argv[:1] == ["--keep-local"]
    for tree in argv[keep_local:] or [str(HERE)]:
        out = subprocess.run([sys.executable, __file__, "--run", tree, *argv[:keep_local]], capture_output=True,
                             text=True, check=True)
        print(f"{tree}: {out.stdout.strip()} µs/message (enqueue + dispatch + dequeue)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
