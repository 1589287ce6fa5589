"""`haqueue audit lag`: its arguments and how it runs, shared by the `haqueue` command (cli.py) and
spark-submit (lag.py run as a script). PySpark is imported only when the audit runs."""
from __future__ import annotations

import argparse
import datetime
import sys

# Exit codes: no loss found; a loss found (--fail-on-loss); usage or input error; cannot tell
# (--fail-on-loss and a window where backups hold messages no primary's log records).
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
    lag.add_argument("--fail-on-loss", action="store_true",
                     help=f"exit {EXIT_LOSS} if a confirmed message is missing or lost, {EXIT_CANNOT_TELL} if the "
                          "events cannot tell (backups hold messages no primary's log records)")


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
    return run_audit(args.events, args.out, args.master, args.since, args.until, args.fail_on_loss, args.ledger)


def main(argv: list[str]) -> int:
    """spark-submit's entry (lag.py as a script): the arguments of `haqueue audit lag`."""
    parser = argparse.ArgumentParser(prog="lag.py", description="haqueue audit lag under spark-submit")
    add_lag_arguments(parser)
    return run_lag(parser.parse_args(argv))
