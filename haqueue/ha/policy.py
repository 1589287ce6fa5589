"""Selective replication: the `x-replicate` argument of queues, exchanges and bindings."""
from __future__ import annotations

from typing import Any

ARGUMENT = "x-replicate"
NONE, CONFIGURATION, ALL = "none", "configuration", "all"
LEVELS = (NONE, CONFIGURATION, ALL)


class Policy:
    """The broker default (`ha.replicate`) and each object's own level."""

    def __init__(self, default: str) -> None:
        self.default = default

    def validate(self, kind: str, name: str, args: dict[str, Any]) -> str | None:
        """A registry validator: a bad value is refused when the object is declared."""
        value = args.get(ARGUMENT)
        if value is not None and value not in LEVELS:
            return f"{ARGUMENT} must be one of {', '.join(LEVELS)}, got {value!r}"
        return None

    def level(self, args: dict[str, Any]) -> str:
        return args.get(ARGUMENT) or self.default

    def replicates_wiring(self, obj: Any) -> bool:
        """Queues and exchanges by their own level; a binding only if it and both its ends are replicated."""
        if hasattr(obj, "exchange") and hasattr(obj, "queue"):
            return (self.level(obj.args) != NONE and self.replicates_wiring(obj.exchange)
                    and self.replicates_wiring(obj.queue))
        return self.level(obj.args) != NONE and not getattr(obj, "temporary", False)

    def replicates_messages(self, queue: Any) -> bool:
        return self.level(queue.args) == ALL and not queue.temporary
