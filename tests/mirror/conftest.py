"""Fixtures for the mirror tests (mirror_harness.py)."""
from __future__ import annotations

import pytest

from mirror_harness import sites_factory


@pytest.fixture
def sites(tmp_path):
    yield from sites_factory(tmp_path)
