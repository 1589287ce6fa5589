"""The format versions of the files haqueue keeps (design/data-formats.md), shared by their readers.

Every file says which format it is in; one that says nothing is format 1, as 0.1.0 wrote it. A build reads
every format up to its own and refuses a newer one rather than misread it: the broker stops with
EXIT_NEWER_FORMAT, and so does a command that reads the file, with the same message. Standard library only:
spark-submit's entry (audit/submit.py) reaches it without haqueue's dependencies.
"""
from __future__ import annotations

from typing import Any, Final

# Neither a usage nor a config error (2), nor an audit's answer (1, 3, 4): this build is older than its data.
EXIT_NEWER_FORMAT: Final = 6
MARKER: Final = "format"  # the key naming a JSON document's format; absent: format 1


class NewerFormat(Exception):
    """A file (or znode) in a format newer than this build reads; it was neither read nor changed."""

    def __init__(self, path: str, version: object, oldest: int, newest: int) -> None:
        readable = str(newest) if oldest == newest else f"{oldest}-{newest}"
        super().__init__(f"{path}: format {version} is newer than this build reads ({readable}): this build is "
                         f"older than the one that wrote it; install that release or newer")
        self.path, self.version, self.oldest, self.newest = path, version, oldest, newest


def check(path: str, version: object, newest: int, oldest: int = 1) -> None:
    """NewerFormat unless this build reads `version` (an int up to `newest`). A version that is no number was
    written by no release this build knows: refused the same way."""
    if not isinstance(version, int) or version > newest:
        raise NewerFormat(path, version, oldest, newest)


def check_document(path: str, document: Any, newest: int) -> None:
    """The same for a JSON document, whose MARKER names its format (0.1.0's readers ignore keys they do not know)."""
    check(path, document.get(MARKER, 1) if isinstance(document, dict) else 1, newest)
