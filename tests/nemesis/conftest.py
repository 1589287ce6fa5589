"""Fixtures for the nemesis suite (tests/nemesis): one cluster at a time, always destroyed.

`nemesis_pool`  a `Pool` (pool.py) for the module (so no cluster outlives it while other suites run): tests ask it for a (coordinator, sync mode) and it
                rebuilds only when that changes (tests are ordered so that it rarely does).
HAQUEUE_NEMESIS_KEEP=1 keeps the clusters' files (logs, ledgers) for a post-mortem.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pool import Pool  # noqa: E402


@pytest.fixture(scope="module")
def nemesis_pool():
    pool = Pool(keep_files=bool(os.environ.get("HAQUEUE_NEMESIS_KEEP")))
    try:
        yield pool
    finally:
        pool.close()
