"""`haqueue audit lag` and `haqueue audit watch`: their arguments and how they run, shared by the
`haqueue` command (cli.py) and spark-submit (submit.py). PySpark is imported only when an audit runs.
However an audit ends, its exit code says how (exits.py): a crash is never taken for a loss."""
from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable

from haqueue.audit import failures
from haqueue.audit.exits import EXIT_CANNOT_TELL, EXIT_JOB_FAILED, EXIT_LOSS, EXIT_USAGE, UsageError
from haqueue.formats import EXIT_NEWER_FORMAT, NewerFormat


def add_lag_arguments(lag: argparse.ArgumentParser) -> None:
    lag.add_argument("--events", metavar="DIR", required=True,
                     help="the events: every *.jsonl and *.parquet file under DIR, at any depth (cluster up "
                          "--audit-dir's DIR: each broker's directory in it); a path, or a URI Spark reads (hdfs://, "
                          "s3a://...)")
    lag.add_argument("--out", metavar="DIR", required=True, help="where the tables and the chart go (a path or URI)")
    lag.add_argument("--ledger", metavar="FILE", nargs="+", action="extend", default=[],
                     help="client ledgers (JSON lines: client, queue, id, op confirmed|received, t); "
                          "reports per queue what producers had confirmed and consumers received: lost, "
                          "duplicated, unexpected")
    lag.add_argument("--standby-events", metavar="DIR",
                     help="the events of the standby cluster the audited one mirrors to (design/mirroring.md): per "
                          "mirrored queue, the messages confirmed at the source that never reached the standby (the "
                          "recovery point, in messages and seconds), duplicates, the mirror's lag")
    lag.add_argument("--mirror-rpo-max", metavar="SECONDS", type=seconds,
                     help="with --standby-events and --fail-on-loss: a confirmed message at risk of a site loss for "
                          "longer than this is a loss (without it the mirror's lag is information)")
    lag.add_argument("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's)")
    lag.add_argument("--since", metavar="T", type=instant, help="only events from T (ISO 8601, UTC unless "
                                                                "it says; or seconds since the epoch)")
    lag.add_argument("--until", metavar="T", type=instant, help="only events before T")
    lag.add_argument("--bound", metavar="DURATION", type=duration, default=datetime.timedelta(seconds=5),
                     help="a backup's copy of a confirmed message counts if logged at most this long after the "
                          "confirmation (default 5s; as `audit watch --bound`)")
    lag.add_argument("--fail-on-loss", action="store_true",
                     help=f"exit {EXIT_LOSS} if a confirmed message is missing or lost, a message was confirmed "
                          "while fewer than a majority held it (at risk) or a rejoining broker kept confirmed messages "
                          f"aside (diverged); {EXIT_CANNOT_TELL} if the events cannot tell (backups hold messages no "
                          "primary's log records)")
    _add_run_arguments(lag)


def add_watch_arguments(watch: argparse.ArgumentParser) -> None:
    watch.add_argument("--events", metavar="DIR", required=True,
                       help="the events: every *.jsonl file under DIR, at any depth, on the driver's file system (a "
                            "path or file://)")
    watch.add_argument("--window", metavar="DURATION", type=duration, default=datetime.timedelta(seconds=10),
                       help="lag percentiles per window of this length (default 10s)")
    watch.add_argument("--bound", metavar="DURATION", type=duration, default=datetime.timedelta(seconds=5),
                       help="a confirmed message is missing on a backup that has not logged it this long after the "
                            "confirmation (default 5s, at least 2s)")
    watch.add_argument("--parquet", metavar="DIR",
                       help="write the rows to Parquet files here (a path or URI) instead of the console")
    watch.add_argument("--checkpoint", metavar="DIR",
                       help="where the job keeps its progress, to go on after a restart, on the driver's file "
                            "system (default PARQUET/_checkpoint; none for the console)")
    watch.add_argument("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's)")
    until = watch.add_mutually_exclusive_group()
    until.add_argument("--once", action="store_true", help="judge the events written so far as a finished record, "
                                                           "print every window and stop")
    until.add_argument("--for", dest="seconds", metavar="SECONDS", type=float,
                       help="stop after this many seconds (default: run until interrupted)")
    _add_run_arguments(watch)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conf", metavar="KEY=VALUE", type=setting, action="append", default=[],
                        help="a Spark setting (repeatable); wins over the audit's own tuning")
    parser.add_argument("--debug", action="store_true",
                        help="on a failure, show Spark's errors and the whole traceback, not one line")


def setting(text: str) -> tuple[str, str]:
    """A Spark setting KEY=VALUE."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def seconds(text: str) -> float:
    """A number of seconds, not negative."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    return value


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
        from haqueue.audit.lag_command import run_audit
    except ImportError as e:
        return _missing_module(e, "PySpark and matplotlib")
    if args.mirror_rpo_max is not None and args.standby_events is None:
        print("haqueue audit: --mirror-rpo-max needs --standby-events: the standby cluster's events", file=sys.stderr)
        return EXIT_USAGE
    return _guarded(lambda: run_audit(args.events, args.out, args.master, args.since, args.until, args.fail_on_loss,
                                      args.ledger, args.bound, dict(args.conf), args.debug, args.standby_events,
                                      args.mirror_rpo_max), args.debug)


def run_watch(args: argparse.Namespace) -> int:
    try:
        from haqueue.audit import measures
        from haqueue.audit.watch import Watch, run_watch
    except ImportError as e:
        return _missing_module(e, "PySpark")
    if args.bound < measures.MIN_BOUND:
        print(f"haqueue audit: --bound must be at least {measures.MIN_BOUND.total_seconds():g}s: a backup marks "
              "its log once a second", file=sys.stderr)
        return EXIT_USAGE
    return _guarded(lambda: run_watch(Watch(args.events, args.window, args.bound, args.parquet, args.checkpoint,
                                            args.master, args.once, args.seconds, dict(args.conf), args.debug)),
                    args.debug)


def _missing_module(error: ImportError, needs: str) -> int:
    """Under spark-submit the driver runs the Python PYSPARK_DRIVER_PYTHON or PYSPARK_PYTHON names (else
    python3): without them, one that lacks haqueue's packages, and the job cannot run (EXIT_JOB_FAILED).
    From the `haqueue` command, the spark extra is not installed: a setup error (EXIT_USAGE)."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        print(f"haqueue audit: the driver's Python ({sys.executable}) cannot import {error.name}: set "
              "PYSPARK_DRIVER_PYTHON and PYSPARK_PYTHON to the Python haqueue is installed in (its venv's "
              "bin/python)", file=sys.stderr)
        return EXIT_JOB_FAILED
    print(f"haqueue audit: needs {needs}: pip install 'haqueue[spark]' ({error})", file=sys.stderr)
    return EXIT_USAGE


def _guarded(run: Callable[[], int], debug: bool) -> int:
    """`run`'s exit code; EXIT_USAGE with the reason for a UsageError, EXIT_NEWER_FORMAT with its message for an
    event file of a newer format, EXIT_JOB_FAILED and one line for any other failure (its traceback, and
    Spark's warnings, only with --debug)."""
    try:
        with warnings.catch_warnings():
            if not debug:  # toPandas warns with the Java stack of a failed job before raising it
                warnings.filterwarnings("ignore", category=UserWarning, module=r"pyspark\.")
            return run()
    except UsageError as e:
        print(f"haqueue audit: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NewerFormat as e:  # an event file of a newer release: read by none of the audit
        print(f"haqueue audit: {e}", file=sys.stderr)
        return EXIT_NEWER_FORMAT
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"haqueue audit: {failures.reason(e)}", file=sys.stderr)
        return EXIT_JOB_FAILED


def main(argv: list[str]) -> int:
    """spark-submit's entry (submit.py): the arguments of `haqueue audit lag`."""
    parser = argparse.ArgumentParser(prog="submit.py", description="haqueue audit lag under spark-submit")
    add_lag_arguments(parser)
    return run_lag(parser.parse_args(argv))
