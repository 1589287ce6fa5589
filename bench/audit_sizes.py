#!/usr/bin/env python3
"""What an audit's time is made of: a cost that does not grow with the events, and a rate per event.

Audits bench/audit_scale.py's Parquet sets of several sizes (default 2.5, 10 and 20 million events), each in a
fresh process and JVM, the sizes in an order rotated each round (this machine's speed drifts up to 1.7x from
minute to minute), and fits a line through each round's times: its intercept is what every audit pays
whatever its size (the JVM's compilers warming up, planning every query), its slope the rate at which the
audit reads events beyond that. Checks the planted answers every time and appends a section to
bench/RESULTS.md.

    .venv/bin/python bench/audit_sizes.py [--sizes 2500000,10000000,20000000] [--rounds 3] [--dir DIR] [--no-record]

--dir DIR keeps the sets in DIR/<events> (made there by an earlier run: used again).
"""
from __future__ import annotations

import argparse
import datetime
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from audit_scale import answers, append, made_set, med_range, prime_class_archive, run_setup
from run import rotated


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(intercept s, events/s of the slope) of the least-squares line through (events, audit s)."""
    mean_x = statistics.mean(x for x, _ in points)
    mean_y = statistics.mean(y for _, y in points)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return mean_y - slope * mean_x, 1 / slope


def section(command: str, sizes: list[int], runs: dict[int, list[dict]], fits: list[tuple[float, float]]) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Audit time by size: what every audit pays, and the rate beyond it (bench/audit_sizes.py), {date}",
             "", "```", command, "```", "",
             "Parquet sets of bench/audit_scale.py's shape, each audit in a fresh process and JVM on `local[*]`, "
             "sizes in an order rotated each round; audit s as audit_scale.py's (the session's start apart). Each "
             "round's times are fitted with a line: fixed s is its intercept, the rate its slope.", "",
             "| events | audit s | events/s | task CPU s | busy cores | planted answers |", "|---|---|---|---|---|---|"]
    for size in sizes:
        ok = [r for r in runs[size] if "error" not in r]
        lines.append(f"| {size:,} | {med_range([r['audit_s'] for r in ok])} | "
                     f"{med_range([r['events'] / r['audit_s'] for r in ok], 0)} | "
                     f"{med_range([r['task_cpu_s'] for r in ok])} | {med_range([r['busy_cores'] for r in ok], 2)} | "
                     f"{answers(runs[size])} |")
    lines += ["", "| per round | fixed s | events/s beyond it |", "|---|---|---|"]
    lines += [f"| {i} | {fixed:.1f} | {rate:,.0f} |" for i, (fixed, rate) in enumerate(fits, start=1)]
    if fits:
        lines.append(f"| median (min–max) | {med_range([f for f, _ in fits])} | {med_range([r for _, r in fits], 0)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2500000,10000000,20000000", help="events per set, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="where the sets go (default: a temporary directory, removed after)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="haqueue-audit-sizes-"))
    runs: dict[int, list[dict]] = {size: [] for size in sizes}
    fits = []
    try:
        for size in sizes:
            made_set(base / str(size), size)
        prime_class_archive(base / str(min(sizes)) / "parquet")
        for round_ in range(args.rounds):
            for size in rotated(sizes, round_):
                result = run_setup(base / str(size) / "parquet", None)
                runs[size].append(result)
                print(f"round {round_ + 1} {size:,} events (load {result['load']:.1f}): " + (result.get("error") or (
                    f"{result['audit_s']:.1f} s, answers {'found' if result['ok'] else 'WRONG'}")), flush=True)
            done = [(r["events"], r["audit_s"]) for r in (runs[size][-1] for size in sizes) if "error" not in r]
            if len(done) >= 2:
                fits.append(fit(done))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    text = section(" ".join(["bench/audit_sizes.py", *sys.argv[1:]]), sizes, runs, fits)
    print(text)
    if not args.no_record:
        append(text)
    return 0 if all(r.get("ok") for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
