"""What an open console page costs the brokers per second, with no traffic to hide it: a `cluster up --size 3`
serving its consoles, measured in alternating windows with a page open (bench/console_page.py polling the
primary's console every second, as the page does) and closed; the CPU each broker used per second of window.

    .venv/bin/python bench/console_idle_cost.py [--windows 6] [--seconds 20] [--queues 1000]

`--queues N` declares N queues first (the queue table copies and sorts them all each second). At saturation the
brokers of a 3-broker cluster use ~1 s of CPU per second, so a page's cost here is its share there
(design/console.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as R  # noqa: E402
import setups as S  # noqa: E402
from console_page import PagePoller  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ms(pids: dict[str, int]) -> dict[str, float]:
    ticks = R.cpu_ticks(list(pids.values()))
    return {name: ticks.get(pid, (0, 0))[0] * 1000 / TICK for name, pid in pids.items()}


def window(pids: dict[str, int], seconds: float, console: str | None) -> dict[str, float]:
    """CPU ms per second of each broker over one window, the page open if `console`."""
    page = PagePoller(console) if console else None
    if page:
        page.start()
    before, started = cpu_ms(pids), time.monotonic()
    time.sleep(seconds)  # the window itself: what is measured is what the brokers do meanwhile
    after, took = cpu_ms(pids), time.monotonic() - started
    if page:
        R.log(f"  the page made {page.stop()}")
    return {name: (after[name] - before[name]) / took for name in pids}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=6, help="windows of each kind, alternating (default 6)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds per window (default 20)")
    ap.add_argument("--queues", type=int, default=0, help="queues declared first (default 0)")
    args = ap.parse_args()
    cluster = S.HaCluster("console idle cost", console=True)
    cluster.start()
    try:
        cluster.wait_ready(60)
        if args.queues:  # as the clients, anonymous on the public address (cluster up lets them manage)
            with R.haqueue_admin().AdminClient(f"{S.HOST}:{cluster.port}", 30) as admin:
                for i in range(args.queues):
                    admin.request("CREATE", "queue", f"idle.q{i}", {})
        pids = cluster.members()
        open_, closed = [], []
        for i in range(args.windows * 2):
            page = i % 2 == 0
            R.log(f"window {i + 1}: page {'open' if page else 'closed'}")
            (open_ if page else closed).append(window(pids, args.seconds, cluster.console if page else None))
    finally:
        cluster.stop()
    print(f"\n{args.windows} windows of {args.seconds:g} s each, page open and closed in turn; {args.queues} queues; "
          f"CPU ms per second, median (min-max):\n")
    print("| broker | page open | page closed | open - closed |\n|---|---|---|---|")
    for name in sorted(pids):
        o, c = [w[name] for w in open_], [w[name] for w in closed]
        diffs = [a - b for a, b in zip(o, c)]
        print(f"| {name} | {statistics.median(o):.2f} ({min(o):.2f}-{max(o):.2f}) | {statistics.median(c):.2f} "
              f"({min(c):.2f}-{max(c):.2f}) | {statistics.median(diffs):+.2f} ({min(diffs):+.2f} to {max(diffs):+.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
