"""Which shard owns a queue (haqueue/shard/ownership.py): a stable hash of the name, or x-shard.

The pinned values below must never change: a queue whose owner changed would be looked for on a shard
that does not hold its messages. A change to the hash fails these first.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from haqueue.shard.errors import ShardError
from haqueue.shard.ownership import owning_shard, parse_shard, shard_of_name


@pytest.mark.parametrize("name, owners", [
    ("orders", [0, 1, 1, 1, 1, 868]),
    ("payments", [0, 0, 0, 0, 11, 587]),
    ("", [0, 1, 2, 5, 5, 22]),
    ("événements", [0, 1, 1, 1, 12, 56]),  # the UTF-8 bytes are hashed
    ("队列", [0, 0, 0, 5, 12, 206]),
    ("orders.eu.1", [0, 0, 0, 0, 0, 694]),
])
def test_the_owner_of_a_name_is_pinned(name: str, owners: list[int]) -> None:
    assert [shard_of_name(name, k) for k in (1, 2, 3, 6, 16, 1000)] == owners


def test_the_owner_does_not_depend_on_the_process() -> None:
    """Python's own hash() of a str differs per process (PYTHONHASHSEED); the owner must not."""
    code = "from haqueue.shard.ownership import shard_of_name; print(shard_of_name('orders', 1000))"
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert out.stdout.strip() == "868"


def test_names_spread_evenly_over_the_shards() -> None:
    counts = Counter(shard_of_name(f"queue-{i}", 6) for i in range(12000))
    assert sorted(counts) == list(range(6))
    assert all(1800 <= count <= 2200 for count in counts.values())  # 2000 each, within 10%


def test_one_more_shard_takes_queues_only_for_itself() -> None:
    """Jump hash: going from K to K+1 shards, a queue either stays or moves to the new shard, and about
    1 in K+1 move, so resharding would move as few queues as it can."""
    names = [f"q{i}" for i in range(6000)]
    for k in (1, 3, 6):
        moved = [name for name in names if shard_of_name(name, k) != shard_of_name(name, k + 1)]
        assert all(shard_of_name(name, k + 1) == k for name in moved)
        assert abs(len(moved) - len(names) / (k + 1)) < 0.1 * len(names) / (k + 1)


def test_x_shard_overrides_the_hash() -> None:
    assert owning_shard("orders", {}, 6) == 1
    assert owning_shard("orders", {"x-shard": 4}, 6) == 4
    assert owning_shard("orders", {"x-shard": "5", "durable": True}, 6) == 5


@pytest.mark.parametrize("value", [0, 5, "0", "5"])
def test_x_shard_takes_a_number_or_its_digits(value: object) -> None:
    assert parse_shard(value, 6) == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [6, -1, "6", "-1", " 1", "one", "", True, 1.0, None, [1], "١"])
def test_a_bad_x_shard_is_refused_naming_the_range_and_the_value(value: object) -> None:
    with pytest.raises(ShardError) as refused:
        parse_shard(value, 6)
    assert str(refused.value) == f"x-shard must be a shard number from 0 to 5, got {value!r}"


def test_shards_must_be_positive() -> None:
    with pytest.raises(ShardError, match="shards must be at least 1, got 0"):
        shard_of_name("orders", 0)
