"""How an audit ends: its exit codes, for CI (design/audit-events.md, "Exit codes"), and `audit ship`'s
(0, 2, 4). Standard library only: spark-submit's entry (submit.py), the argument parsers and `audit ship`
use them without PySpark."""
from __future__ import annotations

EXIT_OK = 0  # no loss found
EXIT_LOSS = 1  # --fail-on-loss: a loss, a confirmation at risk or diverged messages found
EXIT_USAGE = 2  # the command line or its inputs are wrong (no such directory, an unknown scheme...)
EXIT_CANNOT_TELL = 3  # --fail-on-loss: backups hold messages no primary's log records (unattested)
EXIT_JOB_FAILED = 4  # the audit could not run: the Spark job failed, or its driver's Python lacks a module; a
# file could not be shipped


class UsageError(Exception):
    """A command line or input the audit cannot use; its message says why (exit EXIT_USAGE)."""
