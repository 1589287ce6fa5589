"""Exchanges route a message to the queues bound to them, by the message's key (subject or routing-key), and
for a binding with a selector (its argument `selector`: a durable subscription's) by what the selector says of it."""
from __future__ import annotations

import re
from typing import Any, Iterable

from .queue import Queue
from .selector import MessageFields, compile_selector

EXCHANGE_TYPES = ("direct", "topic", "fanout")
SELECTOR = "selector"  # a binding's argument: only the messages this JMS selector is TRUE for go to its queue


class Binding:
    __slots__ = ("exchange", "queue", "key", "args", "uid", "selector")

    def __init__(self, exchange: "Exchange", queue: Queue, key: str, args: dict[str, Any], uid: str) -> None:
        """Raises SelectorError if its selector is invalid."""
        self.exchange = exchange
        self.queue = queue
        self.key = key
        self.args = args
        self.uid = uid
        text = args.get(SELECTOR)
        self.selector = compile_selector(text) if text is not None else None

    def info(self) -> dict[str, Any]:
        return {"exchange": self.exchange.name, "queue": self.queue.name, "key": self.key,
                "args": dict(self.args)}


def topic_regex(pattern: str) -> re.Pattern[str]:
    """AMQP topic pattern: words separated by '.', '*' matches one word, '#' zero or more."""
    parts: list[str] = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"(?:[^.]+(?:\.[^.]+)*)?")
        elif word == "*":
            parts.append(r"[^.]+")
        else:
            parts.append(re.escape(word))
    regex = r"\.".join(parts)
    # '#' may also swallow its neighbouring dot: "a.#" matches "a", "#.b" matches "b".
    regex = regex.replace(r"\.(?:[^.]+(?:\.[^.]+)*)?", r"(?:\.[^.]+)*")
    regex = regex.replace(r"(?:[^.]+(?:\.[^.]+)*)?\.", r"(?:[^.]+\.)*")
    return re.compile(regex + r"\Z")


class Exchange:
    kind = "exchange"

    def __init__(self, name: str, type_: str, args: dict[str, Any], uid: str) -> None:
        self.name = name
        self.type = type_
        self.args = args
        self.uid = uid
        self.bindings: dict[tuple[str, str], Binding] = {}  # (queue name, key) -> binding
        self._patterns: dict[str, re.Pattern[str]] = {}
        # key -> the queues its bindings without a selector take, and its bindings with one
        self._route_cache: dict[str, tuple[list[Queue], list[Binding]]] = {}

    def bind(self, binding: Binding) -> None:
        self.bindings[(binding.queue.name, binding.key)] = binding
        if self.type == "topic" and binding.key not in self._patterns:
            self._patterns[binding.key] = topic_regex(binding.key)
        self._route_cache.clear()

    def unbind(self, queue_name: str, key: str) -> Binding | None:
        binding = self.bindings.pop((queue_name, key), None)
        self._route_cache.clear()
        return binding

    def route(self, key: str, data: bytes) -> list[Queue]:
        """The queues the message `data` with this key goes to, each once."""
        routed = self._route_cache.get(key)
        if routed is None:
            matching: Iterable[Binding]
            if self.type == "fanout":
                matching = self.bindings.values()
            elif self.type == "direct":
                matching = [b for b in self.bindings.values() if b.key == key]
            else:
                matching = [b for b in self.bindings.values() if self._patterns[b.key].match(key)]
            queues = list({id(b.queue): b.queue for b in matching if b.selector is None}.values())
            routed = queues, [b for b in matching if b.selector is not None]
            if len(self._route_cache) > 10000:  # keys may be unbounded (ids in subjects)
                self._route_cache.clear()
            self._route_cache[key] = routed
        queues, selective = routed
        if not selective:
            return queues
        fields = MessageFields(data)
        queues = list(queues)
        for binding in selective:
            if binding.queue not in queues and binding.selector.matches(fields):  # type: ignore[union-attr]
                queues.append(binding.queue)
        return queues

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "args": dict(self.args)}
