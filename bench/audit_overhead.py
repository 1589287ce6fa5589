#!/usr/bin/env python3
"""CPU the audit log adds per message on a broker's thread, measured in-process (no clients, no
sockets), so the figure does not depend on what else the machine is doing.

For a standalone broker's queue: enqueue, confirm and dequeue N distinct 100-byte messages with the
audit hooks installed and without; every --flush-every messages (what 0.2 s brings at saturation),
hand the records to the writer thread as the engine's timer does. Prints µs of CPU per message on
the broker's thread (the hooks, the hand-over) and on the writer thread, best of --repeat.

    .venv/bin/python bench/audit_overhead.py [--messages 100000] [--flush-every 12000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proton import Message  # noqa: E402

from haqueue.audit.events import AuditLog  # noqa: E402
from haqueue.broker.queue import Queue  # noqa: E402
from haqueue.config import AuditConfig  # noqa: E402


def messages(n: int) -> list[bytes]:
    return [bytes(Message(id=f"order-{i}", body=b"x" * 100, durable=True).encode()) for i in range(n)]


def one_run(data: list[bytes], audit: bool, flush_every: int) -> tuple[float, float, float]:
    """CPU seconds (hooks' path and queue work, hand-over, writer thread) for enqueue + confirm + dequeue
    of every message."""
    queue = Queue("orders", {}, uid="6f1c0d2e9a8b4c7d8e9f0a1b2c3d4e5f", schedule=lambda q: None)
    hooks: list = []
    log = None
    if audit:
        broker = SimpleNamespace(name="b0", registry=SimpleNamespace(queues=lambda: [queue], queue_hooks=[]),
                                 completion_hooks=hooks, engine=SimpleNamespace(every=lambda *a: None))
        log = AuditLog(broker, AuditConfig(dir=tempfile.mkdtemp(prefix="audit-overhead-")), None)  # type: ignore
    hot = handing = 0.0
    process_started = time.process_time()
    for first in range(0, len(data), flush_every):
        started = time.thread_time()
        for payload in data[first:first + flush_every]:  # what Publisher.on_message and Consumer.on_outcome do
            entry = queue.enqueue(payload, 0.0)
            if hooks:
                for hook in hooks:
                    hook(queue, entry)
            queue.dequeue(entry)
        flushed = time.thread_time()
        if log is not None:
            log.flush()
        handing += time.thread_time() - flushed
        hot += flushed - started
    if log is not None:
        log.close()  # waits for the writer thread
    writer = time.process_time() - process_started - hot - handing
    return hot, handing, writer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--flush-every", type=int, default=12_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = messages(args.messages)
    base = min(one_run(data, False, args.flush_every)[0] for _ in range(args.repeat))
    runs = [one_run(data, True, args.flush_every) for _ in range(args.repeat)]
    hot, handing, writer = (min(r[i] for r in runs) for i in range(3))
    per = 1e6 / args.messages
    print(f"queue work without audit: {base * per:.2f} µs/msg")
    print(f"broker thread: audit hooks (3 records per message) {(hot - base) * per:.2f} µs/msg, "
          f"hand-over {handing * per:.2f} µs/msg")
    print(f"writer thread (format + write): {writer * per:.2f} µs/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
