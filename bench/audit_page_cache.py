#!/usr/bin/env python3
"""What dropping written audit lines from the page cache saves (haqueue/audit/writer.py).

Appends --gb GB of 110 kB chunks through the audit's Writer, with its page-cache drop every 8 MiB
and without it (a drop interval larger than the file), alternating, and prints the machine's CPU
(all cores, from /proc/stat: the writer's system time and the kernel's writeback) per GB written
once the page cache is full (the first --warm GB left out).

    .venv/bin/python bench/audit_page_cache.py [--gb 3] [--warm 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from haqueue.audit import writer  # noqa: E402

CHUNK = 110_000


def busy_seconds() -> float:
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def cpu_per_gb(drop: bool, gb: float, warm: float) -> float:
    writer.DROP_EVERY = 8 << 20 if drop else 1 << 62
    with tempfile.TemporaryDirectory(prefix="audit-page-cache-") as directory:
        w = writer.Writer(directory, "b0", 1 << 62)
        chunk = b"x" * (CHUNK - 1) + b"\n"
        warm_chunks, chunks = int(warm * 1e9 / CHUNK), int(gb * 1e9 / CHUNK)
        for _ in range(warm_chunks):
            w.write([chunk])
        started = busy_seconds()
        for _ in range(chunks):
            w.write([chunk])
        used = busy_seconds() - started
        w.close()
    return used / (chunks * CHUNK / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=3)
    ap.add_argument("--warm", type=float, default=1)
    args = ap.parse_args()
    for drop in (False, True, False, True):
        print(f"{'drop every 8 MiB' if drop else 'no drop':>16}: {cpu_per_gb(drop, args.gb, args.warm):.2f} "
              f"s of CPU per GB written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
