"""spark-submit's entry for `haqueue audit lag` (design/audit-events.md, "On a Spark cluster"):

    spark-submit --master URL $(python -c 'import haqueue.audit.submit as m; print(m.__file__)') --events URI --out URI

Run as a file by whichever Python spark-submit picks (PYSPARK_DRIVER_PYTHON, PYSPARK_PYTHON, else
python3), so only the standard library is imported here: a Python without haqueue's packages gets a
one-line reason naming the variables to set (command.py), not a traceback.
"""
from __future__ import annotations

import os
import sys


def _stderr_to_spark_submits() -> None:
    """spark-submit (its PythonRunner) merges this process's stderr into its own stdout, where the summary
    goes: write to its stderr instead (Linux; elsewhere stderr stays as it is)."""
    try:
        parent = os.open(f"/proc/{os.getppid()}/fd/2", os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    os.dup2(parent, 2)
    os.close(parent)


if __name__ == "__main__":
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # started by spark-submit, not by hand
        _stderr_to_spark_submits()
    # Run as a file, its own directory is first on sys.path (its modules would shadow others by their
    # short names): the tree it belongs to instead.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from haqueue.audit.command import main

    sys.exit(main(sys.argv[1:]))
