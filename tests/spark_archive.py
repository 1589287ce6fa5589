"""The audit driver's class archive (haqueue/audit/class_archive.py), made before the suite runs if it is missing.

A user's first audit writes the archive as its JVM exits and every later one maps Spark's classes from it. A fresh
machine's test run would never get there: each Spark JVM the tests start is a first one, and they all run with
tests/conftest.py's options, which no writer may share (one archive file, many JVMs at once). So `make test` runs
this first, as it builds the previous release: one audit of the failover scenario in a process of its own, as a
user runs it, whose JVM writes the archive (a minute of one core); the tests' JVMs then start with it
(jvm_options: the drivers', and the standalone cluster's daemons and executors, on the same class path), 13-15
CPU-s less each driver. Quick once made: it only finds the archive.

    .venv/bin/python tests/spark_archive.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

AUDIT_TESTS = Path(__file__).resolve().parent / "audit"  # eventsets: the failover scenario the audit reads
SHARED = "-XX:SharedArchiveFile="
TIMEOUT = 900.0
# The audit tests' Spark jobs are small and short: C1 alone and the serial collector halve the JVM's CPU
# (a cold analysis of the failover scenario: 34 -> 17 CPU s, the session's start 9.5 -> 4.9); C2 and the
# parallel collector only repay on long jobs.
SPARK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def archive_options() -> str:
    """The class_archive options a test JVM may take: the archive's, if one is made; else none."""
    from haqueue.audit import class_archive

    options = class_archive.java_options()
    return options if options.startswith(SHARED) else ""


def jvm_options() -> str:
    """The options of every Spark JVM the tests start: SPARK_JVM_OPTIONS, and the archive's if one is made."""
    try:
        archive = archive_options()
    except ImportError:  # no PySpark: the Spark tests are skipped
        archive = ""
    return f"{SPARK_JVM_OPTIONS} {archive}".rstrip()


def make() -> str:
    """The archive's options, after one audit made it if it was missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return ""
    options = archive_options()
    if options:
        return options
    sys.path.insert(0, str(AUDIT_TESTS))  # here, not at import: conftest imports this module in every test process
    from eventsets import failover_scenario  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as scratch:
        events = failover_scenario().write(Path(scratch) / "events")
        env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
        # Its output is waited for to its end: the JVM writes the archive as it exits, after the command's exit.
        try:
            audit = subprocess.run([sys.executable, "-m", "haqueue", "audit", "lag", "--events", str(events), "--out",
                                    str(Path(scratch) / "out"), "--master", "local[2]"], capture_output=True,
                                   text=True, env=env, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:  # a machine that busy (seen at load 20-27): the tests run without it
            print(f"the audit that makes Spark's class archive took over {TIMEOUT:.0f} s: stopped", file=sys.stderr)
            return ""
        if audit.returncode not in (0, 1):  # 1: the scenario's planted loss, found
            sys.exit(f"the audit that makes Spark's class archive failed (exit {audit.returncode}):\n{audit.stderr}")
    return archive_options()


if __name__ == "__main__":
    made = make()
    print(f"Spark's class archive: {made.split()[0].removeprefix(SHARED) if made else 'none (the tests run without)'}")
