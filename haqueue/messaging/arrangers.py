"""Which arranger a queue gets from its arguments: at most one of x-priorities, x-group-header and
x-last-value-key (each orders or replaces by its own rule, and their mixtures have no one meaning)."""
from __future__ import annotations

from typing import Any, Callable

from ..broker.queue import Arranger, Queue
from .groups import GROUP_HEADER, Groups, header_name, validate as validate_groups
from .last_value import LAST_VALUE_KEY, LastValue, validate as validate_last_value
from .priority import PRIORITIES, Priorities, validate as validate_priorities

# argument -> (its value's check, the arranger it makes)
KINDS: dict[str, tuple[Callable[[Any], str | None], Callable[[Queue, Any], Arranger]]] = {
    PRIORITIES: (validate_priorities, lambda queue, value: Priorities(queue, int(value))),
    GROUP_HEADER: (validate_groups, lambda queue, value: Groups(queue, header_name(value))),
    LAST_VALUE_KEY: (validate_last_value, lambda queue, value: LastValue(queue, str(value))),
}


def validate(kind: str, name: str, args: dict[str, Any]) -> str | None:
    """The registry's validator for the three arguments."""
    present = [key for key in KINDS if key in args]
    if not present:
        return None
    if kind != "queue":
        return f"argument '{present[0]}' is for queues"
    if len(present) > 1:
        return "arguments " + " and ".join(f"'{key}'" for key in present) + " cannot be combined on one queue"
    return KINDS[present[0]][0](args[present[0]])


def attach(queue: Queue) -> None:
    """The registry's queue hook: the queue's arranger, if its arguments ask for one."""
    for key, (_, make) in KINDS.items():
        if key in queue.args:
            queue.arranger = make(queue, queue.args[key])
            return
