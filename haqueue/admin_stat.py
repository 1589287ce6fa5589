"""`haqueue admin stat`: a terminal view of one broker, as `qpid-stat -q` gives: its release, its queues with depth,
bytes, consumers and message rates, and on a primary its backups with state, lag, catch-up progress, release and
the replication protocol it speaks with each (a rolling upgrade's progress, design/upgrades.md).

It reads what the other admin commands read (management READ broker, QUERY queue, READ ha); a rate is the
change of a queue's enqueued or dequeued total between two samples over the time between them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

Call = Callable[[str, str], Any]  # (operation, type) -> the answer's body; raises if refused


@dataclass
class Sample:
    taken: float  # monotonic, when the queues were read
    broker: dict[str, Any]
    queues: dict[str, dict[str, Any]]  # by name, temporary ones left out
    ha: dict[str, Any] | None  # None: a broker without HA


def take(call: Call) -> Sample:
    broker = call("READ", "broker")
    queues = call("QUERY", "queue") or []
    taken = time.monotonic()
    ha = call("READ", "ha") if broker.get("role") != "standalone" else None
    return Sample(taken, broker, {q["name"]: q for q in queues if not q.get("temporary")}, ha)


def _size(n: int) -> str:
    value, unit = float(n), ""
    for unit in ("", "K", "M", "G"):
        if value < 1024:
            break
        value /= 1024
    return str(n) if not unit else f"{value:.1f}{unit}"


def _rate(before: Sample | None, after: Sample, queue: str, field: str) -> str:
    """Per second between the samples; '-' without an earlier sample of the queue, or if its total went
    back (the broker restarted)."""
    if before is None or queue not in before.queues or after.taken <= before.taken:
        return "-"
    change = after.queues[queue][field] - before.queues[queue][field]
    return f"{change / (after.taken - before.taken):.1f}" if change >= 0 else "-"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            .rstrip() for row in [header, *rows]]


def render(before: Sample | None, after: Sample) -> str:
    b, ha = after.broker, after.ha
    head = f"{b['name']}: {b['role']} {b['state']}"
    if ha is not None:
        head += f", epoch {ha['epoch']}" + (f", following {ha['primary']}" if ha.get("primary") else "")
    connections = b["connections"]
    head += f", {connections} connection{'' if connections == 1 else 's'}, messages in memory {_size(b['memory_used'])}"
    head += f", haqueue {b['version']}"
    lines = [head, ""]
    rows = [[name, str(q["depth"]), _size(q["bytes"]), _rate(before, after, name, "enqueued"),
             _rate(before, after, name, "dequeued"), str(q["consumers"])] for name, q in sorted(after.queues.items())]
    lines += table(["queue", "depth", "bytes", "enq/s", "deq/s", "consumers"], rows) if rows else ["(no queues)"]
    if ha is not None and ha.get("role") == "primary":
        rows = [[x["name"], x["state"], str(x["lag"]), f"{x['lag_seconds']:.3f}",
                 f"{x['catchup']['done']}/{x['catchup']['total']}" if x["catchup"]["total"] else "-",
                 x.get("release") or "-", str(x.get("protocol") or "-")]  # a primary of 0.1.0 names neither
                for x in sorted(ha["backups"], key=lambda x: x["name"])]
        lines.append("")
        lines += table(["backup", "state", "lag msgs", "lag s", "catch-up", "release", "protocol"], rows) if rows \
            else ["(no backups)"]
    return "\n".join(lines)


CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def repeat(show: Callable[[], None], interval: float, watch: bool, count: int | None, wait_first: bool) -> None:
    """show() once, or with `watch` every `interval` seconds (`count` times, or until Ctrl-C); `wait_first`:
    `interval` before the first."""
    shown = 0
    try:
        while True:
            if wait_first or shown:
                time.sleep(interval)
            show()
            shown += 1
            if not watch or (count is not None and shown >= count):
                return
    except KeyboardInterrupt:
        return


def run(call: Call, interval: float, watch: bool, count: int | None, write: Callable[[str], None],
        terminal: bool) -> None:
    """Print one view with rates over `interval` seconds; with `watch`, a new one every `interval`. On a
    terminal each view replaces the last; else they follow each other, a blank line apart."""
    samples = [take(call)]

    def show() -> None:
        samples.append(take(call))
        view = render(samples.pop(0), samples[0])
        write(f"{CLEAR}{view}\n" if terminal else f"{view}\n\n")
    repeat(show, interval, watch, count, wait_first=True)
