"""Poison messages (x-max-deliveries, haqueue/messaging/poison.py): a message whose delivery-count reaches the
limit, through modified(delivery-failed) or consumers that went away holding it, goes to the queue's
dead-letter address with the reason in its annotations, or is dropped without one; counted either way. A
plain release does not count. A bad value is refused at declare, naming the argument."""
from __future__ import annotations

import pytest
from proton import Message

from clients import Client

pytestmark = pytest.mark.timeout(60)

LIMITED = {"x-max-deliveries": 3, "dead_letter_address": "dlq"}


def test_a_message_failed_too_often_goes_to_the_dead_letter_address_with_its_reason(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "work", LIMITED)
        c.send("work", [Message(id="poison", body="poison", properties={"k": "v"}), Message(id="fine", body="fine")])
        r = c.receiver("work")
        counts = []
        for _ in range(3):  # delivery-counts 0, 1, 2: the third failure makes it 3
            [m] = r.receive_n(1, settle=None)
            assert m.body == "poison"  # back at its place each time, ahead of "fine"
            counts.append(m.message.delivery_count)
            r.modify(m, failed=True)
        assert counts == [0, 1, 2]
        assert [m.body for m in r.receive_n(1)] == ["fine"]
        queue = c.mgmt("READ", "queue", "work").body
        assert (queue["depth"], queue["poisoned"], queue["dead_lettered"]) == (0, 1, 0), queue
        [dead] = c.receiver("dlq").receive_n(1)
        assert (dead.body, dead.message.id, dead.message.properties) == ("poison", "poison", {"k": "v"})
        assert dead.message.delivery_count == 3
        assert dead.message.annotations == {"x-opt-dead-letter-reason": "delivery-count 3 reached x-max-deliveries 3",
                                            "x-opt-dead-letter-queue": "work"}
    assert "moved to dlq: delivery-count 3 reached x-max-deliveries 3" in broker.log()


def test_consumers_that_die_holding_it_count_and_without_a_dead_letter_address_it_is_dropped(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "work", {"x-max-deliveries": 2})
        c.send("work", ["poison"])
    for _ in range(2):  # each consumer goes away holding it: a failed delivery
        with Client(broker) as c:
            [m] = c.receiver("work").receive_n(1, settle=None)
            assert m.body == "poison"
    with Client(broker) as c:
        queue = c.mgmt("READ", "queue", "work").body
        assert (queue["depth"], queue["poisoned"], queue["dead_lettered"]) == (0, 1, 0), queue
    assert "dropped: delivery-count 2 reached x-max-deliveries 2, and the queue has no dead_letter_address" \
        in broker.log()


def test_a_plain_release_does_not_count(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "queue", "work", {"x-max-deliveries": 1})
        c.send("work", ["released"])
        r = c.receiver("work")
        for _ in range(3):
            [m] = r.receive_n(1, settle=None)
            assert m.message.delivery_count == 0
            r.release(m)
        [m] = r.receive_n(1)
        assert m.body == "released"


@pytest.mark.parametrize("value", [0, -1, "3", True, 2.5])
def test_a_bad_value_is_refused_naming_the_argument(broker, value):
    with Client(broker) as c:
        reply = c.mgmt("CREATE", "queue", "bad", {"x-max-deliveries": value}, expect=None)
        assert reply.status == 400, reply
        assert "queue 'bad': argument 'x-max-deliveries' must be a whole number >= 1" in reply.description
        assert "bad" not in c.queue_names()
