"""Management.deferred: a plug-in's operation that answers a client's request later (the shard wiring broadcast),
after the local operation's needs were checked with the client's rights; `handle` still applies locally."""
from __future__ import annotations

from typing import Any

from proton import Message

from haqueue.broker.server import Broker
from haqueue.config import AllowConfig, BrokerConfig, UserConfig


def _broker(tmp_path) -> Broker:
    users = {"app": UserConfig(password="p", allow=AllowConfig(manage=["orders.*"]))}
    return Broker(BrokerConfig(name="b", listen=[], data_dir=str(tmp_path), users=users, anonymous=None))


def _request(name: str) -> Message:
    return Message(properties={"operation": "CREATE", "type": "exchange", "name": name}, body={"type": "fanout"},
                   reply_to="answers", id=7)


def test_a_deferred_operation_answers_later_and_handle_still_applies_locally(tmp_path) -> None:
    broker = _broker(tmp_path)
    later: list[Any] = []
    broker.management.deferred[("exchange", "CREATE")] = lambda name, body, user, answer: later.append(
        (name, body, user, answer))
    replies: list[Message] = []
    broker.management.answer(_request("orders.x"), "app", replies.append)
    assert replies == [] and broker.registry.lookup("orders.x") is None  # not applied here: the plug-in's to do
    name, body, user, answer = later.pop()
    assert (name, body, user) == ("orders.x", {"type": "fanout"}, "app")
    answer(201, "OK", {"done": True})
    (reply,) = replies
    assert reply.properties == {"statusCode": 201, "statusDescription": "OK"}
    assert (reply.body, reply.correlation_id, reply.address) == ({"done": True}, 7, "answers")

    local = broker.management.handle(_request("orders.y"), "app")
    assert local.properties["statusCode"] == 201 and broker.registry.lookup("orders.y") is not None


def test_a_deferred_operation_is_not_run_for_a_caller_without_the_rights(tmp_path) -> None:
    broker = _broker(tmp_path)
    ran: list[Any] = []
    broker.management.deferred[("exchange", "CREATE")] = lambda *args: ran.append(args)
    replies: list[Message] = []
    broker.management.answer(_request("payments"), "app", replies.append)
    assert ran == []
    assert replies[0].properties == {"statusCode": 403,
                                     "statusDescription": "user 'app' may not manage 'payments'"}
