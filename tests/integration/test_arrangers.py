"""Priority queues, message groups and last-value queues (haqueue/messaging/: x-priorities, x-group-header,
x-last-value-key), with proton Python on a real broker: what consumers and browsers see, released messages
going back to their place, what survives a restart, and bad arguments refused naming the problem."""
from __future__ import annotations

import pytest
from proton import Message
from proton.reactor import Copy, Selector
from proton.utils import LinkDetached

from clients import Client, bodies

pytestmark = pytest.mark.timeout(60)


def _prioritised(n: int) -> list[Message]:
    return [Message(body=f"p{i % 10}-{i}", priority=i % 10, durable=True) for i in range(n)]


def test_higher_priority_first_fifo_within_a_level_and_released_back_to_their_place(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "prio", {"x-priorities": 10})
        c.send("prio", _prioritised(40) + [Message(body="default")])  # no priority: 4
        browsed = bodies(c.receiver("prio", options=Copy()).receive_n(41))
        assert browsed[:3] == ["p0-0", "p1-1", "p2-2"]  # browsers see arrival order
        r = c.receiver("prio")
        first = r.receive_n(2, settle=None)
        assert bodies(first) == ["p9-9", "p9-19"]
        r.release(first[1])
        r.accept(first[0])
        got = bodies(r.receive_n(40))
    # by level, highest first, arrival order within one; "default" (priority 4) after the level's p4s; the
    # released p9-19 back at its place, and p9-9 accepted
    expected = sorted([f"p{i % 10}-{i}" for i in range(40) if i != 9] + ["default"],
                      key=lambda b: (-(4 if b == "default" else int(b[1])), b == "default",
                                     0 if b == "default" else int(b.split("-")[1])))
    assert got == expected


def test_fewer_levels_group_priorities_as_qpid_does(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "two", {"x-priorities": 2})  # 0-4 low, 5-9 high
        c.send("two", [Message(body=f"{p}", priority=p) for p in (0, 4, 5, 9, 3, 7)])
        assert bodies(c.receiver("two").receive_n(6)) == ["5", "9", "7", "0", "4", "3"]


def test_priority_order_survives_a_restart(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "prio", {"x-priorities": 10})
        c.send("prio", _prioritised(20))
    broker.kill()
    broker.start()
    with Client(broker) as c:
        got = bodies(c.receiver("prio").receive_n(20))
    assert [int(b[1]) for b in got] == sorted((i % 10 for i in range(20)), reverse=True)


def _grouped(groups: str, per_group: int) -> list[Message]:
    return [Message(body=f"{g}{i}", group_id=g) if g != "C" else Message(body=f"{g}{i}", properties={"JMSXGroupID": g})
            for i in range(per_group) for g in groups]


def test_a_group_goes_to_one_consumer_at_a_time_in_order(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "grouped", {"x-group-header": True})
        c.send("grouped", _grouped("ABC", 4) + [Message(body="loose")])
        one, two = c.receiver("grouped"), c.receiver("grouped")
        held = one.receive_n(1, settle=None)  # A0: consumer one holds group A
        assert bodies(held) == ["A0"]
        got_two = two.receive_n(9, settle=None)  # B and C, and the loose one; nothing of A while one holds it
        assert sorted(bodies(got_two)) == sorted(["B0", "B1", "B2", "B3", "C0", "C1", "C2", "C3", "loose"])
        assert [b for b in bodies(got_two) if b[0] == "B"] == ["B0", "B1", "B2", "B3"]
        two.expect_nothing()
        assert bodies(one.receive_n(3)) == ["A1", "A2", "A3"]  # the rest of A to its holder, in order
        for m in got_two:
            two.accept(m)
        one.release(held[0])  # one lets go of A: A0 goes to whoever asks
        assert bodies(two.receive_n(1)) == ["A0"]


def test_a_consumer_that_detaches_frees_its_groups(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "grouped", {"x-group-header": "team"})
        c.send("grouped", [Message(body=f"x{i}", properties={"team": "x"}) for i in range(3)])
        first = c.receiver("grouped")
        assert bodies(first.receive_n(1, settle=None)) == ["x0"]
        second = c.receiver("grouped")
        second.expect_nothing()
        first.close()  # x0 released: the group is free, x0 first
        assert bodies(second.receive_n(3)) == ["x0", "x1", "x2"]


def test_a_new_value_replaces_the_queued_one_with_the_same_key(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "prices", {"x-last-value-key": "symbol"})
        c.send("prices", [Message(body=f"{s}={p}", properties={"symbol": s}, durable=True)
                          for p in range(3) for s in ("IBM", "RHT")] + [Message(body="no key")])
        assert c.queue_depth("prices") == 3
        assert bodies(c.receiver("prices", options=Copy()).receive_n(3)) == ["IBM=2", "RHT=2", "no key"]
        r = c.receiver("prices")
        [held] = r.receive_n(1, settle=None)
        assert held.body == "IBM=2"
        c.send("prices", [Message(body="IBM=3", properties={"symbol": "IBM"}, durable=True)])
        assert c.queue_depth("prices") == 4  # an acquired message is not replaced
        r.release(held)
    broker.kill()
    broker.start()
    with Client(broker) as c:  # the index is rebuilt from what the store recovered
        c.send("prices", [Message(body="RHT=9", properties={"symbol": "RHT"}, durable=True)])
        assert c.queue_depth("prices") == 3  # "no key" was not durable
        assert bodies(c.receiver("prices").receive_n(3)) == ["IBM=2", "IBM=3", "RHT=9"]


@pytest.mark.parametrize("args, complaint", [
    ({"x-priorities": 0}, "argument 'x-priorities' must be a whole number from 1 to 10, got 0"),
    ({"x-priorities": 11}, "argument 'x-priorities' must be a whole number from 1 to 10, got 11"),
    ({"x-priorities": "5"}, "argument 'x-priorities' must be a whole number from 1 to 10, got '5'"),
    ({"x-group-header": ""}, "argument 'x-group-header' must be the name of an application property"),
    ({"x-last-value-key": 3}, "argument 'x-last-value-key' must be the name of an application property, got 3"),
    ({"x-priorities": 3, "x-last-value-key": "k"},
     "arguments 'x-priorities' and 'x-last-value-key' cannot be combined on one queue"),
])
def test_bad_arguments_are_refused_naming_the_problem(broker, args, complaint):
    with Client(broker) as c:
        reply = c.mgmt("CREATE", "queue", "bad", args, expect=None)
        assert reply.status == 400, reply
        assert f"queue 'bad': {complaint}" in reply.description
        assert "bad" not in c.queue_names()


def test_a_selector_consumer_on_an_ordered_queue_is_refused_naming_it_and_a_selector_browser_is_not(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "prio", {"x-priorities": 3})
        c.send("prio", [Message(body="a", properties={"a": 1}), Message(body="b", properties={"a": 2})])
        with pytest.raises(LinkDetached) as e:
            c.receiver("prio", options=Selector("a = 1"))
        condition = e.value.link.remote_condition
        assert condition.name == "amqp:not-implemented"
        assert "queue 'prio' orders its messages itself" in condition.description
        assert bodies(c.receiver("prio", options=[Copy(), Selector("a = 2")]).receive_n(1)) == ["b"]
