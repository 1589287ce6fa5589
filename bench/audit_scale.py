#!/usr/bin/env python3
"""Scale benchmark of `haqueue audit lag`: generate an event set of --events events (default 10
million) shaped like a real cluster's, audit it with PySpark on this machine, check the planted
answers and append the time to bench/RESULTS.md (section "Audit: scale").

The set: 4 queues on b0 (primary, epoch 1) with backups b1 and b2, 50,000 msg/s; halfway b0 dies,
b1 takes over (epoch 2) and b0 returns as a backup. Each message is enqueued, confirmed and dequeued
on its primary and replicated and dequeued on both backups: 7 events. Planted: 3 confirmed
messages b2 never received, 2 that b1 received twice.

    .venv/bin/python bench/audit_scale.py [--events 10000000] [--dir DIR] [--keep] [--no-record]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from haqueue.audit import lag, report, sources  # noqa: E402
from haqueue.audit.storage import Storage  # noqa: E402

RESULTS = BENCH / "RESULTS.md"
HEADING = "## Audit: scale (haqueue audit lag)"
T0 = 1_800_000_000_000_000
GAP_US = 20  # 50,000 messages a second
EVENTS_PER_MESSAGE = 7
MISSING_ON_B2, DUPLICATED_ON_B1 = (1001, 2002, 3003), (4004, 5005)
PART_BYTES = 256 * 1024 * 1024


class Files:
    """One broker process's log, rotated by size like the real writer's."""

    def __init__(self, directory: Path, broker: str, run: int) -> None:
        self.directory, self.broker, self.run = directory, broker, run
        self.part, self.size, self.n, self.file = 0, PART_BYTES, 0, None
        self.buffer: list[str] = []

    def line(self, t: int, event: str, role: str, epoch: int, rest: str) -> None:
        self.n += 1
        self.buffer.append(f'{{"t":{t},"event":"{event}","broker":"{self.broker}","role":"{role}","epoch":{epoch},'
                           f'"run":{self.run},"n":{self.n}{rest}}}\n')
        if len(self.buffer) >= 50_000:
            self.flush()

    def flush(self) -> None:
        data = "".join(self.buffer).encode()
        self.buffer.clear()
        if self.size >= PART_BYTES:
            if self.file is not None:
                self.file.close()
            self.part += 1
            self.file = open(self.directory / f"{self.broker}-r{self.run}-{self.part:06d}.jsonl", "wb")
            self.size = 0
        self.file.write(data)
        self.size += len(data)

    def close(self) -> None:
        self.flush()
        self.file.close()


def generate(directory: Path, events: int) -> int:
    """Write the set; returns the number of messages."""
    messages = events // EVENTS_PER_MESSAGE
    half = messages // 2
    logs = {"b0": Files(directory, "b0", 1), "b1": Files(directory, "b1", 2), "b2": Files(directory, "b2", 3)}
    b0_again = Files(directory, "b0", 4)
    next_mark = {name: T0 for name in ("b0", "b1", "b2", "b0 again")}
    for i in range(messages):
        epoch = 1 if i < half else 2
        primary, backups = (logs["b0"], (logs["b1"], logs["b2"])) if epoch == 1 else \
            (logs["b1"], (logs["b2"], b0_again))
        failover_pause = 0 if epoch == 1 else 2_000_000  # two seconds without traffic
        t = T0 + i * GAP_US + failover_pause
        q = i % 4
        seq = (i // 4 + 1) if epoch == 1 else (2 << 40) + (i - half) // 4 + 1
        message = f',"queue":"q{q}","uid":"u{q}","seq":{seq},"message_id":"m-{i}"'
        primary.line(t, "enqueue", "primary", epoch, message)
        ready = '"b1","b2"' if epoch == 1 else '"b2","b0"'
        for k, backup in enumerate(backups):
            if backup.broker == "b2" and i in MISSING_ON_B2:
                continue
            lag_us = 150 + (i * 7919 + k * 104_729) % 900 + (4000 if i % 50_000 < 500 else 0)
            copies = 2 if backup.broker == "b1" and i in DUPLICATED_ON_B1 else 1
            for _ in range(copies):
                backup.line(t + lag_us, "replicate", "backup", epoch, message + f',"mode":"live","enqueued":{t}')
        primary.line(t + 1200, "complete", "primary", epoch, message + f',"backups":[{ready}]')
        primary.line(t + 5000, "dequeue", "primary", epoch, message)
        for backup in backups:
            backup.line(t + 5300, "dequeue", "backup", epoch, message)
        for name, log in (("b0", logs["b0"]), ("b1", logs["b1"]), ("b2", logs["b2"]), ("b0 again", b0_again)):
            if t >= next_mark[name] and (name != "b0" or epoch == 1) and (name != "b0 again" or epoch == 2):
                role = "primary" if log is primary else "backup"
                log.line(t, "mark", role, epoch, "")
                next_mark[name] = t + 1_000_000
    end = T0 + messages * GAP_US + 2_000_000 + 2_000_000
    for log, role in ((logs["b1"], "primary"), (logs["b2"], "backup"), (b0_again, "backup")):
        log.line(end, "mark", role, 2, "")
    for log in (*logs.values(), b0_again):
        log.close()
    return messages


def record(row: str) -> None:
    """Append a row to this benchmark's table in RESULTS.md, read just now: another benchmark appends too."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if HEADING not in text:
        text = (text.rstrip("\n") + f"\n\n{HEADING}\n\n`.venv/bin/python bench/audit_scale.py` generates an event set shaped "
                "like a 3-broker cluster's (4 queues, a failover, 7 events per message), audited with `local[*]` "
                "Spark on this machine. Audit s = reading, parsing, every table, the chart and the summary; the "
                "Spark session start is counted apart.\n\n"
                "| date | events | size | generate s | session start s | audit s | events/s | check |\n"
                "|---|---|---|---|---|---|---|---|\n")
    lines = text.rstrip("\n").split("\n")
    at = lines.index(HEADING)
    end = next((j for j in range(at + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    while not lines[end - 1].strip():
        end -= 1
    lines.insert(end, row)
    RESULTS.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--dir", help="where the events and the output go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the events and the output")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="haqueue-audit-scale-"))
    events_dir, out = base / "events", base / "out"
    shutil.rmtree(events_dir, ignore_errors=True)
    events_dir.mkdir(parents=True)
    try:
        started = time.monotonic()
        messages = generate(events_dir, args.events)
        generated = time.monotonic() - started
        size = sum(f.stat().st_size for f in events_dir.iterdir())
        lines = messages * EVENTS_PER_MESSAGE  # plus marks and the planted changes
        print(f"generated {messages:,} messages (~{lines:,} events, {size / 1e9:.2f} GB) in {generated:.0f} s",
              flush=True)
        started = time.monotonic()
        spark = sources.session()
        session_s = time.monotonic() - started
        started = time.monotonic()
        audit = lag.analyse(spark, str(events_dir))
        Storage(spark).write(str(out), report.outputs(audit))
        audit_s = time.monotonic() - started
        spark.stop()
        print(report.summary(audit))
        b = audit.backups.groupby("backup").sum(numeric_only=True)
        ok = (b["missing"].sum() == 3 and b.loc["b2", "missing"] == 3 and b["duplicates"].sum() == 2
              and b.loc["b1", "duplicates"] == 2 and b["order_violations"].sum() == 0
              and b["dequeues_not_mirrored"].sum() == 0 and audit.totals["bad_lines"] == 0)
        total = audit.totals["events"]
        print(f"Spark session started in {session_s:.0f} s; audited {total:,} events in {audit_s:.0f} s "
              f"({total / audit_s:,.0f} events/s); "
              f"planted answers {'found' if ok else 'WRONG'}")
        if not args.no_record:
            record(f"| {datetime.date.today()} | {total:,} | {size / 1e9:.2f} GB | {generated:.0f} | {session_s:.0f} | "
                   f"{audit_s:.0f} | {total / audit_s:,.0f} | {'planted answers found' if ok else 'WRONG'} "
                   f"({platform.python_version()}, {os.cpu_count()} cores) |")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(base if not args.dir else events_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
