"""Give the C heap's free memory back to the system after connections have gone.

glibc keeps freed memory in the process for reuse: after a burst of connections (each with proton's
transport, and perhaps a large message read part way) the broker's RSS stayed at the burst's high-water
mark although every byte was free. `malloc_trim` returns the free pages; the engine calls it a few
seconds after many connections have closed (design/security.md). Elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable

TRIM_AFTER = 100  # connections closed since the last trim before it is worth one
TRIM_INTERVAL = 5.0  # seconds between looks


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def release_free_memory() -> None:
    if _trim is not None:
        _trim(0)
