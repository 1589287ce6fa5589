"""Registry: the broker's nodes by address. Declares, deletes and auto-creates queues, exchanges and
bindings, gives each a unique id, validates their arguments, and tells observers what changed."""
from __future__ import annotations

import fnmatch
import uuid
from typing import Any, Callable, Protocol

from .errors import BrokerError, NOT_FOUND, INVALID_FIELD, RESOURCE_LOCKED
from .exchange import EXCHANGE_TYPES, SELECTOR, Binding, Exchange
from .flow import BLOCK, OVERFLOW_POLICIES, MemoryAlarm
from .queue import Queue
from .selector import SelectorError

Node = Queue | Exchange

# Queue arguments the core understands, with the type each must have. Keys beginning with
# "x-" belong to plug-ins (HA's x-replicate), which validate them through `validators`.
QUEUE_ARGS: dict[str, tuple[type, ...]] = {
    "max_depth": (int,), "max_bytes": (int,), "overflow": (str,), "exclusive": (bool,), "auto-delete": (bool,),
    "ttl": (int, float), "dead_letter_address": (str,), "durable": (bool,),
}
EXCHANGE_ARGS: dict[str, tuple[type, ...]] = {"durable": (bool,), "auto-delete": (bool,)}
BINDING_ARGS: dict[str, tuple[type, ...]] = {SELECTOR: (str,)}


class RegistryObserver(Protocol):
    def declared(self, node: Node | Binding) -> None: ...
    def deleted(self, node: Node | Binding) -> None: ...


# (kind, name, args) -> a reason the arguments are refused, or None
Validator = Callable[[str, str, dict[str, Any]], str | None]


def _queue_values(args: dict[str, Any]) -> str | None:
    """What is wrong with the values of the core's flow-control arguments (their types are checked)."""
    if args.get("overflow", BLOCK) not in OVERFLOW_POLICIES:
        return f"argument 'overflow' must be one of {', '.join(OVERFLOW_POLICIES)}, got {args['overflow']!r}"
    for key in ("max_depth", "max_bytes"):
        if args.get(key, 0) < 0:
            return f"argument '{key}' must be >= 0 (0: no limit), got {args[key]}"
    return None


class Registry:
    def __init__(self, auto_create: list[str], queue_defaults: dict[str, Any],
                 schedule: Callable[[Queue], None], memory: MemoryAlarm) -> None:
        self.nodes: dict[str, Node] = {}
        self.auto_create = auto_create
        # Arguments from the config's limits for queues declared without them; written into the
        # queue's args so that a replica gets the same limits as its primary.
        self.queue_defaults = queue_defaults
        self.memory = memory
        self._schedule = schedule
        self.observers: list[RegistryObserver] = []
        self.validators: list[Validator] = []
        # Called for each new queue so plug-ins can attach queue observers and guards.
        self.queue_hooks: list[Callable[[Queue], None]] = []

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, address: str) -> Node | None:
        return self.nodes.get(address)

    def resolve(self, address: str) -> Node:
        """The node for an address, auto-creating a queue where the config allows it."""
        node = self.nodes.get(address)
        if node is not None:
            return node
        if any(fnmatch.fnmatchcase(address, pattern) for pattern in self.auto_create):
            return self.declare_queue(address, {})[0]
        raise BrokerError(NOT_FOUND, f"no node named '{address}' and auto-create does not allow it")

    def queues(self) -> list[Queue]:
        return [n for n in self.nodes.values() if isinstance(n, Queue)]

    def exchanges(self) -> list[Exchange]:
        return [n for n in self.nodes.values() if isinstance(n, Exchange)]

    def bindings(self) -> list[Binding]:
        return [b for x in self.exchanges() for b in x.bindings.values()]

    # -- declare / delete --------------------------------------------------------------------
    def _validate(self, kind: str, name: str, args: dict[str, Any], known: dict[str, tuple[type, ...]]) -> None:
        if not name:
            raise BrokerError(INVALID_FIELD, f"a {kind} needs a name")
        for key, value in args.items():
            if key.startswith("x-"):
                continue
            types = known.get(key)
            if types is None:
                raise BrokerError(INVALID_FIELD, f"{kind} '{name}': unknown argument '{key}' "
                                                 f"(known: {', '.join(sorted(known))}, or x-*)")
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                raise BrokerError(INVALID_FIELD, f"{kind} '{name}': argument '{key}' must be "
                                                 f"{' or '.join(t.__name__ for t in types)}, got {value!r}")
        for validator in self.validators:
            reason = validator(kind, name, args)
            if reason:
                raise BrokerError(INVALID_FIELD, f"{kind} '{name}': {reason}")

    def declare_queue(self, name: str, args: dict[str, Any], uid: str | None = None,
                      temporary: bool = False) -> tuple[Queue, bool]:
        """(queue, created). Declaring an existing queue is fine; an exchange of that name is a conflict."""
        existing = self.nodes.get(name)
        if isinstance(existing, Queue):
            return existing, False
        if existing is not None:
            raise BrokerError(RESOURCE_LOCKED, f"'{name}' is an exchange, not a queue")
        self._validate("queue", name, args, QUEUE_ARGS)
        reason = _queue_values(args)
        if reason:
            raise BrokerError(INVALID_FIELD, f"queue '{name}': {reason}")
        args = {**self.queue_defaults, **args}
        queue = Queue(name, args, uid or uuid.uuid4().hex, self._schedule, self.memory)
        queue.temporary = temporary
        self.nodes[name] = queue
        for hook in self.queue_hooks:
            hook(queue)
        for observer in self.observers:
            observer.declared(queue)
        return queue, True

    def declare_exchange(self, name: str, type_: str, args: dict[str, Any],
                         uid: str | None = None) -> tuple[Exchange, bool]:
        if type_ not in EXCHANGE_TYPES:
            raise BrokerError(INVALID_FIELD, f"exchange '{name}': type must be one of "
                                             f"{', '.join(EXCHANGE_TYPES)}, got {type_!r}")
        existing = self.nodes.get(name)
        if isinstance(existing, Exchange):
            if existing.type != type_:
                raise BrokerError(RESOURCE_LOCKED, f"exchange '{name}' exists with type {existing.type}")
            return existing, False
        if existing is not None:
            raise BrokerError(RESOURCE_LOCKED, f"'{name}' is a queue, not an exchange")
        self._validate("exchange", name, args, EXCHANGE_ARGS)
        exchange = Exchange(name, type_, args, uid or uuid.uuid4().hex)
        self.nodes[name] = exchange
        for observer in self.observers:
            observer.declared(exchange)
        return exchange, True

    def delete(self, name: str, kind: str | None = None) -> Node:
        node = self.nodes.get(name)
        if node is None or (kind is not None and node.kind != kind):
            raise BrokerError(NOT_FOUND, f"no {kind or 'node'} named '{name}'")
        del self.nodes[name]
        if isinstance(node, Queue):
            for exchange in self.exchanges():
                for qname, key in [k for k in exchange.bindings if k[0] == name]:
                    self._unbound(exchange.unbind(qname, key))
            node.delete()
        else:
            for binding in list(node.bindings.values()):
                self._unbound(node.unbind(binding.queue.name, binding.key))
        for observer in self.observers:
            observer.deleted(node)
        return node

    def _unbound(self, binding: Binding | None) -> None:
        if binding is not None:
            for observer in self.observers:
                observer.deleted(binding)

    def bind(self, exchange_name: str, queue_name: str, key: str, args: dict[str, Any],
             uid: str | None = None) -> tuple[Binding, bool]:
        exchange = self.nodes.get(exchange_name)
        queue = self.nodes.get(queue_name)
        if not isinstance(exchange, Exchange):
            raise BrokerError(NOT_FOUND, f"no exchange named '{exchange_name}'")
        if not isinstance(queue, Queue):
            raise BrokerError(NOT_FOUND, f"no queue named '{queue_name}'")
        existing = exchange.bindings.get((queue_name, key))
        if existing is not None:
            return existing, False
        self._validate("binding", f"{exchange_name}->{queue_name}", args, BINDING_ARGS)
        try:
            binding = Binding(exchange, queue, key, args, uid or uuid.uuid4().hex)
        except SelectorError as e:
            raise BrokerError(INVALID_FIELD, f"binding '{exchange_name}->{queue_name}': invalid selector "
                                             f"{args[SELECTOR]!r}: {e}") from None
        exchange.bind(binding)
        for observer in self.observers:
            observer.declared(binding)
        return binding, True

    def unbind(self, exchange_name: str, queue_name: str, key: str) -> Binding:
        exchange = self.nodes.get(exchange_name)
        if not isinstance(exchange, Exchange):
            raise BrokerError(NOT_FOUND, f"no exchange named '{exchange_name}'")
        binding = exchange.unbind(queue_name, key)
        if binding is None:
            raise BrokerError(NOT_FOUND, f"no binding of '{queue_name}' to '{exchange_name}' with key '{key}'")
        self._unbound(binding)
        return binding
