"""Exchanges route a message to the queues bound to them, by the message's key (subject or routing-key)."""
from __future__ import annotations

import re
from typing import Any, Iterable

from .queue import Queue

EXCHANGE_TYPES = ("direct", "topic", "fanout")


class Binding:
    __slots__ = ("exchange", "queue", "key", "args", "uid")

    def __init__(self, exchange: "Exchange", queue: Queue, key: str, args: dict[str, Any], uid: str) -> None:
        self.exchange = exchange
        self.queue = queue
        self.key = key
        self.args = args
        self.uid = uid

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
        self._route_cache: dict[str, list[Queue]] = {}

    def bind(self, binding: Binding) -> None:
        self.bindings[(binding.queue.name, binding.key)] = binding
        if self.type == "topic" and binding.key not in self._patterns:
            self._patterns[binding.key] = topic_regex(binding.key)
        self._route_cache.clear()

    def unbind(self, queue_name: str, key: str) -> Binding | None:
        binding = self.bindings.pop((queue_name, key), None)
        self._route_cache.clear()
        return binding

    def route(self, key: str) -> list[Queue]:
        """The queues a message with this key goes to, each once."""
        queues = self._route_cache.get(key)
        if queues is None:
            matching: Iterable[Binding]
            if self.type == "fanout":
                matching = self.bindings.values()
            elif self.type == "direct":
                matching = [b for b in self.bindings.values() if b.key == key]
            else:
                matching = [b for b in self.bindings.values() if self._patterns[b.key].match(key)]
            queues = list({id(b.queue): b.queue for b in matching}.values())
            if len(self._route_cache) > 10000:  # keys may be unbounded (ids in subjects)
                self._route_cache.clear()
            self._route_cache[key] = queues
        return queues

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "args": dict(self.args)}
