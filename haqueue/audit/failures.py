"""A failed audit in one line: what the Spark job's exception says, without its Py4J traceback."""
from __future__ import annotations

import re
from typing import Any

# A Spark error condition and its message, as Spark writes them: "[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered...".
# Read from the messages' text, not from the exceptions' fields: a failure inside a Python callback (the
# console watch's foreachBatch) reaches the JVM as the text of a Python traceback.
_CONDITION = re.compile(r"\[([A-Z][A-Z_]*(?:\.[A-Z_]+)*)\] ([^\n]*)")
_UNREADABLE = "FAILED_READ_FILE"  # a file the executors could not read; its message names it
_FILE = re.compile(r"reading file (\S+)\.(?:\s|$)")


def reason(error: BaseException) -> str:
    """`error` as one line: the innermost Spark error condition its Java causes tell (what went wrong,
    under the "job aborted" and "query terminated" around it), else its root cause."""
    chain = _java_chain(error)
    texts = [str(throwable.getMessage() or "") for throwable in chain] or [str(error)]
    found = [match for text in texts for match in _CONDITION.finditer(text)]
    if found:
        condition, message = found[-1].groups()
        kind, _, detail = condition.partition(".")
        unreadable = _FILE.search(message) if kind == _UNREADABLE else None
        if unreadable:
            return (f"the Spark job failed: executors cannot read {unreadable[1]} ({detail or kind}); is the events "
                    "directory shared with every worker?")
        return f"the Spark job failed: [{condition}] {message.strip()}"
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


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "(no message)"
