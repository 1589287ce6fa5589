"""`haqueue audit lag`: a Spark session (local[*] by default; on a cluster through spark-submit, submit.py), the
paths checked, the audit (lag.py) run under a progress line, its tables and chart written (report.py), the summary
printed, and the exit code."""
from __future__ import annotations

from datetime import timedelta
from typing import Mapping, Sequence

from haqueue.audit import measures
from haqueue.audit.exits import EXIT_CANNOT_TELL, EXIT_LOSS, EXIT_OK
from haqueue.audit.lag import Audit, analyse_input
from haqueue.audit.progress import Progress
from haqueue.audit.sources import input_size, read_events, session, tune_for
from haqueue.audit.storage import Storage, check_paths, uri


def run_audit(events: str, out: str, master: str | None, since: int | None, until: int | None,
              fail_on_loss: bool, ledgers: Sequence[str] = (), bound: timedelta = measures.DEFAULT_BOUND,
              conf: Mapping[str, str] | None = None, debug: bool = False, standby_events: str | None = None,
              rpo_limit: float | None = None) -> int:
    """`haqueue audit lag`: analyse, write the tables and the chart, print the summary; the exit code.
    Paths may be URIs (storage.py); UsageError when one is not there. standby_events: the events of the standby
    cluster the audited one mirrors to (mirror_rpo.py); rpo_limit: --mirror-rpo-max."""
    from haqueue.audit import report  # matplotlib: after pandas (lag.py), the one a wrong PYSPARK_PYTHON is told of

    inputs = [events] if standby_events is None else [events, standby_events]

    def check(storage: Storage | None) -> None:
        for directory in inputs:
            check_paths(directory, ledgers if directory is events else (), out, storage)
    check(None)  # the driver's own paths, before a JVM starts
    sizes = [input_size(directory) for directory in inputs]
    spark = session(master, conf, debug, None if None in sizes else sum(s for s in sizes if s is not None))
    try:
        storage = Storage(spark)
        check(storage)
        found = read_events(spark, uri(events))  # Spark's listing: the progress line's and the tuning's
        standby = read_events(spark, uri(standby_events)) if standby_events is not None else None
        size = found.size + (standby.size if standby is not None else 0)
        tune_for(spark, size, given=conf or {})
        files = found.files + (standby.files if standby is not None else 0)
        on_disk = found.bytes + (standby.bytes if standby is not None else 0)
        with Progress(spark.sparkContext, f"{files:,} event files, {on_disk / 1e6:,.1f} MB"):
            audit = analyse_input(found, since, until, ledgers, bound, standby=standby, rpo_limit=rpo_limit)
        storage.write(out, report.outputs(audit))
    finally:
        spark.stop()
    print(report.summary(audit))
    return exit_code(audit) if fail_on_loss else EXIT_OK


def exit_code(audit: Audit) -> int:
    """--fail-on-loss's answer: a confirmed message lost, missing, at risk or kept aside (diverged) is a loss; a
    message kept aside that was never confirmed as replicated is not (its publisher was not told it was safe). The
    mirror's lag is information, unless its recovery point passed --mirror-rpo-max."""
    over_rpo = audit.mirror is not None and not audit.mirror.over_limit.empty
    if audit.missing or audit.lost or audit.at_risk or audit.diverged or over_rpo:
        return EXIT_LOSS
    return EXIT_CANNOT_TELL if audit.unattested else EXIT_OK
