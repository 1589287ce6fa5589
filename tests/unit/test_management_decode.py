"""A management request (`$management`, or a shard's `$shard.wiring`) is decoded once for either endpoint and
handed on, its delivery left for the caller to settle."""
from __future__ import annotations

from typing import Any

from proton import Message

from haqueue.broker.management import decode_request


class _Link:
    def __init__(self) -> None:
        self.settled: list[tuple[Any, ...]] = []

    def settle(self, *args: Any) -> None:
        self.settled.append(args)


def test_a_request_is_decoded_and_its_delivery_left_to_the_caller() -> None:
    link = _Link()
    data = Message(properties={"operation": "READ", "type": "broker"}, reply_to="r").encode()
    request = decode_request(link, 4, data)  # type: ignore[arg-type]
    assert request is not None and request.properties == {"operation": "READ", "type": "broker"}
    assert link.settled == []
