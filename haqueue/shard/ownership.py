"""Which shard owns a queue: the queue's `x-shard` argument if it has one, else a stable hash of its name.

The hash must never change (a queue that moved shard would lose its messages), so it is neither Python's
hash() (salted per process) nor anything a library may redefine. It is written out here and pinned by
tests/unit/test_shard_ownership.py:

    key   = the first 8 bytes of SHA-256(the name in UTF-8), as an unsigned big-endian integer
    shard = jump(key, K), the jump consistent hash (Lamping & Veach, 2014) in integer arithmetic:
              b, j = -1, 0
              while j < K:
                  b = j
                  key = (key * 2862933555777941757 + 1) mod 2**64
                  j = ((b + 1) * 2**31) // ((key >> 33) + 1)
              return b

Jump hash rather than `key mod K` because, should K ever grow, only the queues a new shard must take
(1 in K+1) change owner, not nearly all of them; any language computes both lines the same way.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from .errors import ShardError

SHARD_ARGUMENT = "x-shard"
_MULTIPLIER = 2862933555777941757
_MASK = (1 << 64) - 1


def shard_of_name(name: str, shards: int) -> int:
    _check_shards(shards)
    key = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    bucket, candidate = -1, 0
    while candidate < shards:
        bucket = candidate
        key = (key * _MULTIPLIER + 1) & _MASK
        candidate = ((bucket + 1) << 31) // ((key >> 33) + 1)
    return bucket


def owning_shard(name: str, args: Mapping[str, Any], shards: int) -> int:
    """The shard of queue `name` declared with `args`: its x-shard, or the hash of its name."""
    if SHARD_ARGUMENT not in args:
        return shard_of_name(name, shards)
    return parse_shard(args[SHARD_ARGUMENT], shards)


def parse_shard(value: Any, shards: int) -> int:
    """An x-shard value: a shard number 0..K-1, as an integer or a string of digits (clients that can send
    only strings, JMS address options among them)."""
    _check_shards(shards)
    number = value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < shards:
        raise ShardError(f"{SHARD_ARGUMENT} must be a shard number from 0 to {shards - 1}, got {value!r}")
    return number


def _check_shards(shards: int) -> None:
    if shards < 1:
        raise ShardError(f"shards must be at least 1, got {shards}")
