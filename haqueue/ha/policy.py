"""Selective replication: the `x-replicate` argument of queues, exchanges and bindings, and which messages of a
message-replicated queue stay on the primary alone (design/replication.md, "Selective replication")."""
from __future__ import annotations

from typing import Any, Callable

from ..broker.message import transient_or_unreplicated, unreplicated
from ..config import REPLICATE_LEVELS as LEVELS

ARGUMENT = "x-replicate"
NONE, CONFIGURATION, DURABLE, ALL = LEVELS
MESSAGE_LEVELS = (DURABLE, ALL)  # the levels whose queues replicate messages (DURABLE: the durable ones)


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
        return self.level(queue.args) in MESSAGE_LEVELS and not queue.temporary

    def keeps_local(self, queue: Any) -> Callable[[bytes], bool]:
        """Which messages of a message-replicated queue stay on the primary: those annotated `x-replicate: false`,
        and under `durable` the transient ones too (both read from the message's bytes, compiled: the hot path)."""
        return transient_or_unreplicated if self.level(queue.args) == DURABLE else unreplicated
