#!/usr/bin/env python3
"""CPU the audit log adds per message on a broker's thread, measured in-process (no clients, no
sockets), so the figure does not depend on what else the machine is doing.

For a standalone broker's queue: enqueue, confirm and dequeue N distinct 100-byte messages with the
audit hooks installed and without; every --per-pass messages (a loop pass at saturation handles
tens to hundreds), write the records as the end of a pass does (`broker.flush_hooks`). Prints µs of
CPU per message on the broker's thread: the hooks, and the end-of-pass write, best of --repeat.

    .venv/bin/python bench/audit_overhead.py [--messages 100000] [--per-pass 100] [--repeat 5]
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


def one_run(data: list[bytes], audit: bool, per_pass: int) -> tuple[float, float]:
    """CPU seconds (hooks' path and queue work, end-of-pass writes) for enqueue + confirm + dequeue of
    every message."""
    queue = Queue("orders", {}, uid="6f1c0d2e9a8b4c7d8e9f0a1b2c3d4e5f", schedule=lambda q: None)
    hooks: list = []
    log = None
    if audit:
        broker = SimpleNamespace(name="b0", registry=SimpleNamespace(queues=lambda: [queue], queue_hooks=[]),
                                 completion_hooks=hooks, flush_hooks=[], engine=SimpleNamespace(every=lambda *a: None))
        log = AuditLog(broker, AuditConfig(dir=tempfile.mkdtemp(prefix="audit-overhead-")), None)  # type: ignore
    hot = writing = 0.0
    for first in range(0, len(data), per_pass):
        started = time.thread_time()
        for payload in data[first:first + per_pass]:  # what Publisher.on_message and Consumer.on_outcome do
            entry = queue.enqueue(payload, 0.0)
            if hooks:
                for hook in hooks:
                    hook(queue, entry)
            queue.dequeue(entry)
        flushed = time.thread_time()
        if log is not None:
            log.write()
        writing += time.thread_time() - flushed
        hot += flushed - started
    if log is not None:
        log.close()
    return hot, writing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--per-pass", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = messages(args.messages)
    base = min(one_run(data, False, args.per_pass)[0] for _ in range(args.repeat))
    runs = [one_run(data, True, args.per_pass) for _ in range(args.repeat)]
    hot, writing = (min(r[i] for r in runs) for i in range(2))
    per = 1e6 / args.messages
    print(f"queue work without audit: {base * per:.2f} µs/msg")
    print(f"broker thread: audit hooks (3 records per message) {(hot - base) * per:.2f} µs/msg, "
          f"end-of-pass writes (format + write, one per {args.per_pass} messages) {writing * per:.2f} µs/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
