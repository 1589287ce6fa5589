"""The console's actions and reads as management requests: the same operations, permission checks and
answers as a `$management` client's (haqueue admin's), made on the broker's loop for the logged-in user."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proton import Message

from ..loop_calls import answer_from_loop

if TYPE_CHECKING:
    from ..broker.server import Broker

TIMEOUT = 10.0  # seconds an operation may take, a sharded cluster's broadcast included


@dataclass
class Answer:
    status: int
    description: str
    body: Any
    properties: dict[str, Any]  # a QUERY's total, count and next


class ManagementCalls:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def request(self, user: str, operation: str, type_: str, name: str | None = None, body: Any = None,
                paging: dict[str, Any] | None = None) -> Answer:
        """Ask the management node as `user` would over AMQP; its answer, a refusal (403) or failure included."""
        properties: dict[str, Any] = {"operation": operation, "type": type_, **(paging or {})}
        if name is not None:
            properties["name"] = name
        request = Message(properties=properties, body=body)
        management = self.broker.management

        def begin(give: Any) -> None:  # on the loop: as ManagementEndpoint answers a request
            management.answer(request, user, give)
        reply: Message = answer_from_loop(self.broker.engine.call_soon_threadsafe, begin, TIMEOUT)
        answer: dict[str, Any] = dict(reply.properties or {})
        return Answer(int(answer.pop("statusCode", 500)), str(answer.pop("statusDescription", "")), reply.body,
                      answer)
