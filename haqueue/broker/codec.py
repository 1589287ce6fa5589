"""What proton's codec can hold: a message's body is encoded in one pn_data of at most 65,535 values (a map, a
list, each key and each value is one). Management pages and the HA wiring snapshot stay within it."""
from __future__ import annotations

from typing import Any, Final

MAX_NODES: Final = 65_535


def nodes(value: Any) -> int:
    """The values encoding `value` takes."""
    if isinstance(value, dict):
        return 1 + sum(nodes(k) + nodes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 1 + sum(map(nodes, value))
    return 1
