"""The one error the shard package raises: bad input, with a message naming what is wrong."""
from __future__ import annotations


class ShardError(ValueError):
    """A node list, assignment or x-shard value that cannot be used; str() says why."""
