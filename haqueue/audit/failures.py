"""A failed audit in one line: what the Spark job's exception says, without its Py4J traceback."""
from __future__ import annotations

from typing import Any

# Spark's error conditions of a file that its executors could not read, and what to check then.
_UNREADABLE = {"FAILED_READ_FILE"}
_SHARED = "is the events directory shared with every worker?"


def reason(error: BaseException) -> str:
    """`error` as one line: the first Spark error condition among its Java causes, else the root cause."""
    chain = _java_chain(error)
    for throwable in chain:
        condition = _condition(throwable)
        if condition is None:
            continue
        kind, _, detail = condition.partition(".")
        if kind in _UNREADABLE:
            path = throwable.getMessageParameters().get("path")
            return f"the Spark job failed: executors cannot read {path} ({detail or kind}); {_SHARED}"
        return f"the Spark job failed: {_first_line(throwable.getMessage())}"
    if chain:
        return f"the Spark job failed: {_first_line(chain[-1].toString())}"
    return f"the audit failed: {type(error).__name__}: {_first_line(str(error))}"


def _java_chain(error: BaseException) -> list[Any]:
    """The Java exceptions behind `error` (Py4J's, or PySpark's captured ones), outermost first."""
    chain: list[Any] = []
    seen: BaseException | None = error
    while seen is not None and not chain:
        # Py4JJavaError.java_exception; PySpark's CapturedException keeps the Java one as _origin.
        throwable = getattr(seen, "java_exception", None) or getattr(seen, "_origin", None)
        while throwable is not None:
            chain.append(throwable)
            throwable = throwable.getCause()
        seen = seen.__cause__ or seen.__context__
    return chain


def _condition(throwable: Any) -> str | None:
    """The error condition of a SparkThrowable (e.g. FAILED_READ_FILE.FILE_NOT_EXIST), else None."""
    try:
        return throwable.getCondition()
    except Exception:  # not a SparkThrowable: Py4J finds no such method
        return None


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "(no message)"
