"""`haqueue audit lag` and `haqueue audit watch` run in the tests' own process.

A command run with `run_haqueue` is a process of its own: it starts a JVM and compiles the audit's Spark
queries again, 20-30 s of CPU on 2 cores for a few dozen events, where the same command in a JVM that
has run an audit before takes a few seconds. `run_audit_command` calls the `haqueue` command's own entry
(haqueue.cli.main) with the same arguments and returns what `run_haqueue` does: the exit code, and what
the command printed on stdout and stderr. The command starts its Spark session, or joins the one
running in this process, and stops it at its end, as it does in a process of its own; the next session
starts in the same JVM in under a second (tests/audit/conftest.py's `spark` fixture gets it).

One test per command still runs it as a process of its own (test_lag's long audit, through spark-submit;
test_watch's live watch): that a fresh process starts Spark, keeps Spark's own output off stdout
and exits with the code main returned is checked there.
"""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys


def run_audit_command(args: list[str]) -> subprocess.CompletedProcess:
    """`haqueue ARGS` (`audit lag ...` or `audit watch ...`) in this process; its exit code and output."""
    assert args[:1] == ["audit"], args
    # Imported first: the progress reporter's default stream is the stderr of when it was imported.
    from haqueue.audit import lag, watch  # noqa: F401
    from haqueue.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    except BaseException:  # what it printed goes with the failure's report
        print(out.getvalue())
        print(err.getvalue()[-3000:], file=sys.stderr)
        raise
    return subprocess.CompletedProcess(["haqueue", *args], code, out.getvalue(), err.getvalue())
