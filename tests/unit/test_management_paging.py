"""Management at scale (design/management.md): a QUERY answers a page of what the caller may see and its
`filter` matches, in name order, with `total`, `count` and `next`; a page always encodes; an answer that
cannot be encoded is a 500 saying so; requests wait at their link and take turns, each link holding a small
window of credit."""
from __future__ import annotations

from typing import Any

import pytest
from proton import Message

from haqueue.broker import management, query_pages
from haqueue.broker.server import Broker
from haqueue.config import ANONYMOUS_USER, AllowConfig, BrokerConfig, UserConfig

EVERYTHING = AllowConfig(send=["*"], receive=["*"], manage=["*"], admin=True)


def _broker(tmp_path, queues: int = 0) -> Broker:
    users = {"app": UserConfig(password="p", allow=AllowConfig(receive=["orders.*"]))}
    broker = Broker(BrokerConfig(name="b", listen=[], data_dir=str(tmp_path), users=users, anonymous=EVERYTHING))
    for i in range(queues):
        broker.registry.declare_queue(f"q-{i:05d}", {})
    return broker


def _query(broker: Broker, type_: str = "queue", user: str = ANONYMOUS_USER, body: Any = None,
           **paging: Any) -> Message:
    return broker.management.handle(Message(properties={"operation": "QUERY", "type": type_, **paging},
                                            body=body), user)


def _pages(broker: Broker, **paging: Any) -> list[list[str]]:
    pages, after = [], None
    while True:
        reply = _query(broker, **paging, **({} if after is None else {"after": after}))
        assert reply.properties["statusCode"] == 200, reply.properties
        reply.encode()
        pages.append([q["name"] for q in reply.body])
        after = reply.properties.get("next")
        if after is None:
            return pages


def test_a_query_without_paging_answers_the_first_page_and_says_what_follows(tmp_path) -> None:
    broker = _broker(tmp_path, 1200)
    reply = _query(broker)
    assert len(reply.body) == query_pages.PAGE
    assert [q["name"] for q in reply.body] == [f"q-{i:05d}" for i in range(query_pages.PAGE)]
    assert (reply.properties["total"], reply.properties["count"]) == (1200, query_pages.PAGE)
    assert reply.properties["next"]
    reply.encode()


def test_pages_are_disjoint_complete_and_in_name_order(tmp_path) -> None:
    broker = _broker(tmp_path, 2500)
    pages = _pages(broker, count=400)
    assert [len(page) for page in pages] == [400] * 6 + [100]
    assert sum(pages, []) == [f"q-{i:05d}" for i in range(2500)]


def test_count_is_capped_and_offset_skips(tmp_path) -> None:
    broker = _broker(tmp_path, 1500)
    assert len(_query(broker, count=5000).body) == query_pages.PAGE
    reply = _query(broker, offset=1495, count=10)
    assert [q["name"] for q in reply.body] == [f"q-{i:05d}" for i in range(1495, 1500)]
    assert "next" not in reply.properties
    counted = _query(broker, count=0)
    assert (counted.body, counted.properties["total"]) == ([], 1500)


def test_a_page_starts_after_its_cursor_whatever_came_or_went_before_it(tmp_path) -> None:
    broker = _broker(tmp_path, 30)
    first = _query(broker, count=10)
    broker.registry.delete("q-00003")
    broker.registry.declare_queue("a-new", {})
    second = _query(broker, count=10, after=first.properties["next"])
    assert [q["name"] for q in second.body] == [f"q-{i:05d}" for i in range(10, 20)]
    assert second.properties["total"] == 30


def test_the_filter_is_a_glob_on_names_and_paging_applies_after_it(tmp_path) -> None:
    broker = _broker(tmp_path, 2000)
    assert sum(_pages(broker, filter="q-01*", count=40), []) == [f"q-{i:05d}" for i in range(1000, 2000)]
    reply = _query(broker, filter="q-0000?")
    assert [q["name"] for q in reply.body] == [f"q-{i:05d}" for i in range(10)]
    assert reply.properties["total"] == 10
    assert _query(broker, filter="nothing*").body == []


def test_a_caller_pages_through_only_what_it_may_see(tmp_path) -> None:
    broker = _broker(tmp_path, 100)
    for i in range(30):
        broker.registry.declare_queue(f"orders.{i:02d}", {})
    reply = _query(broker, user="app", count=20)
    assert [q["name"] for q in reply.body] == [f"orders.{i:02d}" for i in range(20)]
    assert reply.properties["total"] == 30
    rest = _query(broker, user="app", after=reply.properties["next"])
    assert [q["name"] for q in rest.body] == [f"orders.{i:02d}" for i in range(20, 30)]
    assert _query(broker, user="app", filter="q-*").body == []


def test_bindings_page_by_exchange_queue_and_key_and_the_body_still_narrows(tmp_path) -> None:
    broker = _broker(tmp_path, 5)
    broker.registry.declare_exchange("x", "direct", {})
    for i in range(5):
        for key in ("a", "b"):
            broker.registry.bind("x", f"q-{i:05d}", key, {})
    reply = _query(broker, "binding", count=3)
    assert [(b["queue"], b["key"]) for b in reply.body] == [("q-00000", "a"), ("q-00000", "b"), ("q-00001", "a")]
    rest = _query(broker, "binding", after=reply.properties["next"])
    assert len(rest.body) == 7 and "next" not in rest.properties
    assert [b["key"] for b in _query(broker, "binding", body={"queue": "q-00002"}).body] == ["a", "b"]
    assert [b["queue"] for b in _query(broker, "binding", filter="q-00004").body] == ["q-00004", "q-00004"]


@pytest.mark.parametrize("paging", [{"count": -1}, {"count": "ten"}, {"offset": True}, {"filter": 3},
                                    {"after": "not a cursor"}, {"after": "7"}])
def test_bad_paging_is_a_400(tmp_path, paging: dict[str, Any]) -> None:
    reply = _query(_broker(tmp_path, 3), **paging)
    assert reply.properties["statusCode"] == 400, reply.properties


def test_a_page_holds_no_more_than_proton_can_encode(tmp_path) -> None:
    broker = _broker(tmp_path)
    fat = {f"x-{i}": i for i in range(200)}  # ~400 nodes a queue: 500 of them would be 200,000
    for i in range(400):
        broker.registry.declare_queue(f"fat-{i:03d}", fat)
    pages = _pages(broker)
    assert len(pages) > 1 and sum(pages, []) == [f"fat-{i:03d}" for i in range(400)]


def test_an_answer_proton_cannot_encode_is_a_500_saying_so(tmp_path) -> None:
    broker = _broker(tmp_path)
    broker.registry.declare_queue("huge", {f"x-{i}": i for i in range(40_000)})
    link = _Link()
    endpoint = broker.management.endpoint(link)  # type: ignore[arg-type]
    sent = _capture(broker)
    endpoint.on_message(1, _request("READ", "queue", "huge"), False)
    broker.pass_end.after_pass()
    (reply,) = sent
    assert reply.properties["statusCode"] == 500
    assert "could not be encoded" in reply.properties["statusDescription"]
    assert link.settled == [(1, management.ACCEPTED)]


def test_a_burst_on_one_link_takes_turns_with_another_link(tmp_path) -> None:
    broker = _broker(tmp_path)
    flood, ping = _Link(), _Link()
    flooding = broker.management.endpoint(flood)  # type: ignore[arg-type]
    pinging = broker.management.endpoint(ping)  # type: ignore[arg-type]
    assert flood.granted == ping.granted == management.WINDOW
    sent = _capture(broker)
    for i in range(management.WINDOW):
        flooding.on_message(i, _request("CREATE", "queue", f"burst-{i}", correlation=i), False)
    broker.pass_end.after_pass()  # the burst's first turns
    answered = len(sent)
    pinging.on_message(0, _request("READ", "broker", correlation="ping"), False)
    broker.pass_end.after_pass()
    assert sent[answered].correlation_id == "ping"  # ahead of the burst's next
    while flooding.waiting:
        broker.pass_end.after_pass()
    assert sorted(r.correlation_id for r in sent if r.correlation_id != "ping") == list(range(management.WINDOW))
    assert flood.granted == 2 * management.WINDOW  # one more credit for each answer
    assert ping.granted == management.WINDOW + 1


def test_a_detached_links_waiting_requests_are_dropped(tmp_path) -> None:
    broker = _broker(tmp_path)
    link = _Link()
    endpoint = broker.management.endpoint(link)  # type: ignore[arg-type]
    sent = _capture(broker)
    endpoint.on_message(1, _request("READ", "broker"), False)
    endpoint.on_detach()
    link.closed = True
    broker.pass_end.after_pass()
    assert sent == [] and link.settled == []


class _Conn:
    user = ANONYMOUS_USER


class _Link:
    """What ManagementEndpoint uses of a proton_adapter.Link."""

    def __init__(self) -> None:
        self.conn = _Conn()
        self.closed = False
        self.held = False
        self.granted = 0
        self.settled: list[tuple[Any, ...]] = []

    def hold_credit(self) -> None:
        self.held = True

    def flow(self, credit: int) -> None:
        self.granted += credit

    def settle(self, *args: Any) -> None:
        self.settled.append(args)


def _request(operation: str, type_: str, name: str | None = None, correlation: Any = 7) -> bytes:
    properties = {"operation": operation, "type": type_, **({} if name is None else {"name": name})}
    return Message(id=correlation, reply_to="answers", properties=properties, body={}).encode()


def _capture(broker: Broker) -> list[Message]:
    """The answers the broker delivers, decoded."""
    sent: list[Message] = []

    def deliver(address: str, data: bytes) -> None:
        reply = Message()
        reply.decode(data)
        sent.append(reply)
    broker.deliver = deliver  # type: ignore[method-assign]
    broker.registry.declare_queue("answers", {})  # where the requests ask their answers to go
    return sent
