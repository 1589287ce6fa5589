"""`haqueue audit lag` and `haqueue audit watch`: their arguments and how they run, shared by the
`haqueue` command (cli.py) and spark-submit (lag.py run as a script). PySpark is imported only when
an audit runs."""
from __future__ import annotations

import argparse
import datetime
import re
import sys

# Exit codes: no loss found; a loss, a confirmation at risk or diverged messages found (--fail-on-loss); usage
# or input error; cannot tell (--fail-on-loss and a window where backups hold messages no primary's log records).
EXIT_OK, EXIT_LOSS, EXIT_USAGE, EXIT_CANNOT_TELL = 0, 1, 2, 3


def add_lag_arguments(lag: argparse.ArgumentParser) -> None:
    lag.add_argument("--events", metavar="DIR", required=True, help="the audit directory (files *.jsonl)")
    lag.add_argument("--out", metavar="DIR", required=True, help="where the tables and the chart go")
    lag.add_argument("--ledger", metavar="FILE", nargs="+", action="extend", default=[],
                     help="client ledgers (JSON lines: client, queue, id, op confirmed|received, t); "
                          "reports per queue what producers had confirmed and consumers received: lost, "
                          "duplicated, unexpected")
    lag.add_argument("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's)")
    lag.add_argument("--since", metavar="T", type=instant, help="only events from T (ISO 8601, UTC unless "
                                                                "it says; or seconds since the epoch)")
    lag.add_argument("--until", metavar="T", type=instant, help="only events before T")
    lag.add_argument("--bound", metavar="DURATION", type=duration, default=datetime.timedelta(seconds=5),
                     help="a backup's copy of a confirmed message counts if logged at most this long after the "
                          "confirmation (default 5s; as `audit watch --bound`)")
    lag.add_argument("--fail-on-loss", action="store_true",
                     help=f"exit {EXIT_LOSS} if a confirmed message is missing or lost, a message was confirmed "
                          "while fewer than a majority held it (at risk) or a rejoining broker kept messages aside "
                          f"(diverged); {EXIT_CANNOT_TELL} if the events cannot tell (backups hold messages no "
                          "primary's log records)")


def add_watch_arguments(watch: argparse.ArgumentParser) -> None:
    watch.add_argument("--events", metavar="DIR", required=True, help="the audit directory (files *.jsonl)")
    watch.add_argument("--window", metavar="DURATION", type=duration, default=datetime.timedelta(seconds=10),
                       help="lag percentiles per window of this length (default 10s)")
    watch.add_argument("--bound", metavar="DURATION", type=duration, default=datetime.timedelta(seconds=5),
                       help="a confirmed message is missing on a backup that has not logged it this long after the "
                            "confirmation (default 5s, at least 2s)")
    watch.add_argument("--parquet", metavar="DIR", help="write the rows to Parquet files here instead of the console")
    watch.add_argument("--checkpoint", metavar="DIR",
                       help="where the job keeps its progress, to go on after a restart (default "
                            "PARQUET/_checkpoint; none for the console)")
    watch.add_argument("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's)")
    until = watch.add_mutually_exclusive_group()
    until.add_argument("--once", action="store_true", help="judge the events written so far as a finished record, "
                                                           "print every window and stop")
    until.add_argument("--for", dest="seconds", metavar="SECONDS", type=float,
                       help="stop after this many seconds (default: run until interrupted)")


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> datetime.timedelta:
    """A duration: a number and a unit (ms, s, m, h, d), e.g. 10s; a bare number is seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h|d)?\s*", text)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration such as 10s, 500ms, 2m, got {text!r}")
    return datetime.timedelta(seconds=float(match[1]) * _UNITS[match[2] or "s"])


def instant(text: str) -> int:
    """A time as microseconds since the epoch."""
    try:
        return int(float(text) * 1e6)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ISO 8601 or seconds since the epoch, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1e6)


def run_lag(args: argparse.Namespace) -> int:
    try:
        from haqueue.audit.lag import run_audit
    except ImportError as e:
        print(f"haqueue: audit needs PySpark and matplotlib: pip install 'haqueue[spark]' ({e})", file=sys.stderr)
        return EXIT_USAGE
    return run_audit(args.events, args.out, args.master, args.since, args.until, args.fail_on_loss, args.ledger,
                     args.bound)


def run_watch(args: argparse.Namespace) -> int:
    try:
        from haqueue.audit import measures
        from haqueue.audit.watch import Watch, run_watch
    except ImportError as e:
        print(f"haqueue: audit needs PySpark: pip install 'haqueue[spark]' ({e})", file=sys.stderr)
        return EXIT_USAGE
    if args.bound < measures.MIN_BOUND:
        print(f"haqueue: audit: --bound must be at least {measures.MIN_BOUND.total_seconds():g}s: a backup marks "
              "its log once a second", file=sys.stderr)
        return EXIT_USAGE
    return run_watch(Watch(args.events, args.window, args.bound, args.parquet, args.checkpoint, args.master,
                           args.once, args.seconds))


def main(argv: list[str]) -> int:
    """spark-submit's entry (lag.py as a script): the arguments of `haqueue audit lag`."""
    parser = argparse.ArgumentParser(prog="lag.py", description="haqueue audit lag under spark-submit")
    add_lag_arguments(parser)
    return run_lag(parser.parse_args(argv))
