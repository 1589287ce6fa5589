#!/usr/bin/env python3
"""CPU the audit log adds per message on a broker's thread, measured in-process (no clients, no
sockets), so the figure does not depend on what else the machine is doing.

For a standalone broker's queue: enqueue, confirm and dequeue N distinct 100-byte messages with the
audit hooks installed and without; every --flush-every messages (what 0.2 s brings at saturation),
format and write the records as the engine's timer does. Prints µs per message for the hooks and
for the writing, best of --repeat.

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


def one_run(data: list[bytes], audit: bool, flush_every: int) -> tuple[float, float]:
    """(seconds in the hooks' path, seconds writing) for enqueue + confirm + dequeue of every message."""
    queue = Queue("orders", {}, uid="6f1c0d2e9a8b4c7d8e9f0a1b2c3d4e5f", schedule=lambda q: None)
    hooks: list = []
    log = None
    if audit:
        later: list = []  # the engine's call_later (the rest of a flush, next pass): run by hand below
        engine = SimpleNamespace(every=lambda *a: None, call_later=lambda delay, fn: later.append(fn))
        broker = SimpleNamespace(name="b0", registry=SimpleNamespace(queues=lambda: [queue], queue_hooks=[]),
                                 completion_hooks=hooks, engine=engine)
        log = AuditLog(broker, AuditConfig(dir=tempfile.mkdtemp(prefix="audit-overhead-")), None)  # type: ignore
    hot = writing = 0.0
    for first in range(0, len(data), flush_every):
        started = time.perf_counter()
        for payload in data[first:first + flush_every]:  # what Publisher.on_message and Consumer.on_outcome do
            entry = queue.enqueue(payload, 0.0)
            if hooks:
                for hook in hooks:
                    hook(queue, entry)
            queue.dequeue(entry)
        flushed = time.perf_counter()
        if log is not None:
            log.flush()
            while later:
                later.pop()()
        writing += time.perf_counter() - flushed
        hot += flushed - started
    if log is not None:
        log.close()
    return hot, writing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--flush-every", type=int, default=12_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = messages(args.messages)
    base = min(one_run(data, False, args.flush_every)[0] for _ in range(args.repeat))
    runs = [one_run(data, True, args.flush_every) for _ in range(args.repeat)]
    hot = min(r[0] for r in runs) - base
    writing = min(r[1] for r in runs)
    per = 1e6 / args.messages
    print(f"queue work without audit: {base * per:.2f} µs/msg")
    print(f"audit hooks (3 records per message): {hot * per:.2f} µs/msg")
    print(f"audit writing (format + write): {writing * per:.2f} µs/msg ({writing * per / 3:.2f} µs per line)")
    print(f"audit total: {(hot + writing) * per:.2f} µs/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
