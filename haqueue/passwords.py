"""Salted password hashes for the config's `password_hash:` (made by `haqueue passwd`).

The format is a PHC string, which names its function and parameters, so the cost can be raised
later without breaking the hashes already written:

    $scrypt$ln=14,r=8,p=1$<salt>$<hash>      (salt and hash: base64 without padding)

scrypt (hashlib, RFC 7914) with N = 2**ln, block size r and parallelism p. Checking costs one
scrypt computation (tens of milliseconds, 16 MiB at the defaults): design/permissions.md.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re

LOG_N, BLOCK_SIZE, PARALLELISM = 14, 8, 1  # N = 16384: ~16 MiB, tens of ms per check
SALT_BYTES, HASH_BYTES = 16, 32
MAX_MEMORY = 256 * 1024 * 1024  # a hash whose parameters need more is refused (a typo, not a policy)

_FORMAT = re.compile(r"\$scrypt\$ln=(\d{1,2}),r=(\d{1,3}),p=(\d{1,3})\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def _memory(log_n: int, r: int, p: int) -> int:
    """What hashlib.scrypt needs (128·r·N for the work area, 128·r·p for the input blocks), with slack."""
    return 128 * r * ((1 << log_n) + p + 2)


def make_hash(password: str) -> str:
    """A new salted hash of `password`, for `password_hash:`."""
    salt = os.urandom(SALT_BYTES)
    key = hashlib.scrypt(password.encode(), salt=salt, n=1 << LOG_N, r=BLOCK_SIZE, p=PARALLELISM,
                         maxmem=_memory(LOG_N, BLOCK_SIZE, PARALLELISM), dklen=HASH_BYTES)
    return f"$scrypt$ln={LOG_N},r={BLOCK_SIZE},p={PARALLELISM}${_b64(salt)}${_b64(key)}"


class BadHash(ValueError):
    """A `password_hash:` that is not one `make_hash` writes; the message says what is wrong."""


def _parse(stored: str) -> tuple[int, int, int, bytes, bytes]:
    match = _FORMAT.fullmatch(stored)
    if match is None:
        raise BadHash("is not a hash made by `haqueue passwd` ($scrypt$ln=N,r=N,p=N$SALT$HASH)")
    log_n, r, p = (int(x) for x in match.group(1, 2, 3))
    if not (1 <= log_n <= 30 and r >= 1 and p >= 1):
        raise BadHash(f"has scrypt parameters out of range (ln={log_n}, r={r}, p={p})")
    if _memory(log_n, r, p) > MAX_MEMORY:
        raise BadHash(f"needs more than {MAX_MEMORY >> 20} MiB to check (ln={log_n}, r={r}, p={p})")
    try:
        salt, key = _unb64(match.group(4)), _unb64(match.group(5))
    except binascii.Error:
        raise BadHash("has a salt or hash that is not base64") from None
    if len(key) < 16:
        raise BadHash("has a hash shorter than 16 bytes")
    return log_n, r, p, salt, key


def check_hash(stored: str) -> None:
    """Raise BadHash unless `stored` can be used to check passwords (the config checks it at start)."""
    _parse(stored)


def verify(stored: str, password: str) -> bool:
    """Whether `password` is the one `stored` was made from (constant time in the comparison)."""
    log_n, r, p, salt, key = _parse(stored)
    computed = hashlib.scrypt(password.encode(), salt=salt, n=1 << log_n, r=r, p=p,
                              maxmem=_memory(log_n, r, p), dklen=len(key))
    return hmac.compare_digest(computed, key)
