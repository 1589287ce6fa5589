"""Durable and shared subscriptions (haqueue/messaging/subscriptions.py), with proton Python as Qpid JMS would use
them: a receiver on an exchange with a durable source (proton's DurableSubscription) gets a queue named from its
container-id and link name that outlives detach and the connection and is resumed by the same names; a closing
detach (unsubscribe) deletes it. Shared ones (source capability `shared`, `global`) are one queue for several
receivers. A selector applies to the subscription; another selector makes it anew. A restart keeps a durable
subscription and its durable messages."""
from __future__ import annotations

import json

import pytest
from proton import Data, Message, Terminus
from proton.reactor import Container, DurableSubscription, ReceiverOption, Selector
from proton.utils import LinkDetached

from clients import Client, bodies
from harness import run_haqueue

pytestmark = pytest.mark.timeout(60)


class Capabilities(ReceiverOption):
    """Source capabilities, as Qpid JMS sets them for a shared subscription (`shared`, and `global` without a
    client id)."""

    def __init__(self, *capabilities: str) -> None:
        self.capabilities = capabilities

    def apply(self, receiver) -> None:
        data = receiver.source.capabilities  # an array of symbols, as Qpid JMS and rhea send them
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for capability in self.capabilities:
            data.put_symbol(capability)
        data.exit()


class NoSource(ReceiverOption):
    """No source at all: how Qpid JMS looks a durable subscription up to unsubscribe it."""

    def apply(self, receiver) -> None:
        receiver.source.type = Terminus.UNSPECIFIED


def client(broker, container: str) -> Client:
    return Client(broker, container=Container(container_id=container))


def subscribe(c: Client, name: str, *options: ReceiverOption, address: str = "prices", credit: int = 0):
    return c.receiver(address, credit=credit, name=name, options=[DurableSubscription(), *options])


def detach(c: Client, receiver) -> None:
    """A detach with closed=false: the subscription stays."""
    receiver.link.detach()
    c.roundtrip()  # answered after the broker has taken the detach


def read(data) -> object:
    """What a terminus field holds (proton's Data)."""
    data.rewind()
    return data.get_object() if data.next() else None


def refusal(attach) -> object:
    """The condition of an attach the broker refused."""
    with pytest.raises(LinkDetached) as e:
        attach()
    return e.value.link.remote_condition


def queue_list(broker) -> dict[str, dict]:
    """`haqueue admin queue list`, by name."""
    p = run_haqueue(["admin", "-b", broker.address, "queue", "list"])
    assert p.returncode == 0, p.stderr
    return {q["name"]: q for q in map(json.loads, p.stdout.splitlines())}


def publish(c: Client, texts: list[str], exchange: str = "prices", **props) -> None:
    c.send(exchange, [Message(body=t, subject="eur.usd", durable=True, **props) for t in texts])


@pytest.fixture
def prices(broker):
    with Client(broker) as c:
        c.mgmt("CREATE", "exchange", "prices", {"type": "topic"})
    return broker


def test_a_durable_subscription_outlives_its_link_and_connection_and_is_resumed_then_unsubscribed(prices):
    with client(prices, "app1") as c:
        assert "SHARED-SUBS" in c.connection.remote_offered_capabilities
        r = subscribe(c, "ticks")
        assert r.link.remote_source.durability == Terminus.DELIVERIES
        assert r.link.remote_source.expiry_policy == Terminus.EXPIRE_NEVER
        publish(c, ["a", "b"])
        assert bodies(r.receive_n(2)) == ["a", "b"]
        detach(c, r)
    with Client(prices) as c:
        publish(c, [f"m{i}" for i in range(5)])  # confirmed while no one is subscribed
    queues = queue_list(prices)
    sub = queues["app1:ticks"]
    assert sub["depth"] == 5 and sub["consumers"] == 0
    assert sub["args"] == {"x-subscription": "prices", "x-subscription-container": "app1",
                           "x-subscription-user": "anonymous", "exclusive": True}
    with client(prices, "app2") as c:  # the same link name in another container: a subscription of its own
        other = subscribe(c, "ticks")
        other.expect_nothing(0.2)
        other.close()  # closed: gone
    with client(prices, "app1") as c:
        r = subscribe(c, "ticks")
        assert bodies(r.receive_n(5)) == [f"m{i}" for i in range(5)]
        with client(prices, "app1") as twin:  # not shared: one receiver at a time
            assert refusal(lambda: subscribe(twin, "ticks")).name == "amqp:resource-locked"
        r.close()  # closed=true: JMS unsubscribe
    assert not [name for name in queue_list(prices) if name.endswith(":ticks")]


def test_qpid_jms_unsubscribes_by_looking_the_subscription_up_with_no_source(prices):
    with client(prices, "app1") as c:
        r = subscribe(c, "gone", Selector("colour = 'green'"))
        detach(c, r)
        missing = refusal(lambda: c.receiver(None, name="never", options=[NoSource()]))
        assert missing.name == "amqp:not-found"
        assert "no durable subscription named 'never' for container 'app1'" in missing.description
        found = c.receiver(None, name="gone", options=[NoSource()])
        source = found.link.remote_source
        assert (source.address, source.durability, source.expiry_policy) == \
            ("prices", Terminus.DELIVERIES, Terminus.EXPIRE_NEVER)
        assert read(source.filter)["jms-selector"].value == "colour = 'green'"
        assert list(read(source.capabilities).elements) == ["topic"]
        found.close()
    assert "app1:gone" not in queue_list(prices)


def test_shared_subscriptions_split_the_messages_among_their_receivers(prices):
    with client(prices, "app1") as c:  # Qpid JMS's link names for one shared durable subscription: `name`, `name|2`
        first = subscribe(c, "orders", Capabilities("topic", "shared"), credit=20)
        second = subscribe(c, "orders|2", Capabilities("topic", "shared"), credit=20)
        assert list(read(second.link.remote_source.capabilities).elements) == ["topic", "shared"]
        publish(c, [f"m{i}" for i in range(20)])
        got = bodies(first.receive_n(10, credit=False)) + bodies(second.receive_n(10, credit=False))  # round robin
        assert sorted(got) == sorted(f"m{i}" for i in range(20))
        assert queue_list(prices)["app1:orders"]["consumers"] == 2
        detach(c, first)
        detach(c, second)
    assert queue_list(prices)["app1:orders"]["depth"] == 0  # durable: it stays


def test_a_global_shared_volatile_subscription_lives_while_a_receiver_is_attached(prices):
    name = "feed:shared-volatile:global"
    with client(prices, "a") as a, client(prices, "b") as b:  # two containers: global names ignore the container
        ra = a.receiver("prices", name="feed|global-volatile1", credit=10, options=[Capabilities("shared", "global")])
        rb = b.receiver("prices", name="feed|global-volatile1", credit=10, options=[Capabilities("shared", "global")])
        b.roundtrip()  # its credit is there
        assert queue_list(prices)[name]["consumers"] == 2
        publish(a, [f"m{i}" for i in range(10)])
        got = bodies(ra.receive_n(5, credit=False)) + bodies(rb.receive_n(5, credit=False))  # round robin
        assert sorted(got) == sorted(f"m{i}" for i in range(10))
        ra.close()
        assert name in queue_list(prices)
        detach(b, rb)
    assert name not in queue_list(prices)


def test_the_selector_applies_and_another_selector_makes_the_subscription_anew(prices):
    green = Selector("colour = 'green'")
    with client(prices, "app1") as c:
        detach(c, subscribe(c, "greens", green))
        for colour in ("green", "red", "green", "red"):
            publish(c, [colour], properties={"colour": colour})
        assert c.queue_depth("app1:greens") == 2  # what it does not match never reaches it, even detached
        r = subscribe(c, "greens", green)
        assert bodies(r.receive_n(2)) == ["green", "green"]
        detach(c, r)
        publish(c, ["red"], properties={"colour": "red"})
        r = subscribe(c, "greens", Selector("colour = 'red'"))  # replaced, as JMS and Artemis have it
        r.expect_nothing(0.2)
        publish(c, ["red again"], properties={"colour": "red"})
        assert bodies(r.receive_n(1)) == ["red again"]
        assert c.mgmt("READ", "queue", "app1:greens").body["args"]["x-subscription-selector"] == "colour = 'red'"
    assert "replaced: exchange 'prices' and selector \"colour = 'red'\"" in prices.log()


def test_a_restart_keeps_a_durable_subscription_its_selector_and_its_durable_messages(prices):
    green = Selector("colour = 'green'")
    with client(prices, "app1") as c:
        detach(c, subscribe(c, "kept", green))
        publish(c, ["durable"], properties={"colour": "green"})
        c.send("prices", [Message(body="transient", subject="x", properties={"colour": "green"})])
    prices.kill()
    prices.start()
    with client(prices, "app1") as c:
        for colour in ("red", "green"):  # still bound, with its selector
            publish(c, [f"after-{colour}"], properties={"colour": colour})
        r = subscribe(c, "kept", green)
        assert bodies(r.receive_n(2)) == ["durable", "after-green"]
        r.expect_nothing(0.2)


def test_durability_or_sharing_on_a_queue_is_a_plain_consumer(prices):
    with client(prices, "app1") as c:
        c.mgmt("CREATE", "queue", "work")
        c.send("work", ["one", "two"])
        r = subscribe(c, "work-sub", Capabilities("shared"), address="work")
        assert bodies(r.receive_n(1)) == ["one"]
        r.close()
        assert c.queue_depth("work") == 1


class DurableUntilSessionEnd(ReceiverOption):
    """A durable source that still expires (proton's default expiry-policy, session-end)."""

    def apply(self, receiver) -> None:
        receiver.source.durability = Terminus.DELIVERIES


def test_a_durable_source_that_expires_gets_a_temporary_subscription_and_the_attach_says_so(prices):
    with client(prices, "app1") as c:
        r = c.receiver("prices", name="brief", options=[DurableUntilSessionEnd()])
        assert r.link.remote_source.durability == Terminus.NONDURABLE
        assert r.link.remote_source.expiry_policy == Terminus.EXPIRE_WITH_LINK
        assert not [name for name in queue_list(prices) if name.startswith("app1:")]


def test_another_users_subscription_cannot_be_resumed(broker_factory):
    b = broker_factory(anonymous=False, users={"alice": "pa", "bob": "pb"})
    with Client(b, user="alice", password="pa") as c:
        c.mgmt("CREATE", "exchange", "prices", {"type": "topic"})
    with Client(b, user="alice", password="pa", container=Container(container_id="app1")) as c:
        detach(c, subscribe(c, "mine"))
    with Client(b, user="bob", password="pb", container=Container(container_id="app1")) as c:
        refused = refusal(lambda: subscribe(c, "mine"))
        assert refused.name == "amqp:unauthorized-access"
        assert "subscription 'app1:mine' belongs to another user" in refused.description


def test_a_binding_with_a_selector_takes_only_what_it_matches_and_a_bad_one_is_refused(prices):
    with Client(prices) as c:
        c.mgmt("CREATE", "queue", "greens")
        c.mgmt("CREATE", "binding", body={"exchange": "prices", "queue": "greens", "key": "#",
                                          "selector": "colour = 'green'"})
        for colour in ("green", "red"):
            publish(c, [colour], properties={"colour": colour})
        assert c.queue_depth("greens") == 1
        reply = c.mgmt("CREATE", "binding", body={"exchange": "prices", "queue": "greens", "key": "a",
                                                  "selector": "colour ="}, expect=None)
        assert reply.status == 400 and "binding 'prices->greens': invalid selector 'colour ='" in reply.description


def test_a_queue_of_the_subscriptions_name_is_never_taken_over_and_bad_arguments_are_refused(prices):
    with client(prices, "app1") as c:
        c.mgmt("CREATE", "queue", "app1:clash")
        c.send("app1:clash", ["mine"])
        refused = refusal(lambda: subscribe(c, "clash"))
        assert refused.name == "amqp:resource-locked"
        assert "queue 'app1:clash' exists and is not this link's subscription" in refused.description
        assert c.queue_depth("app1:clash") == 1
        reply = c.mgmt("CREATE", "queue", "odd", {"x-subscription": 7}, expect=None)
        assert reply.status == 400 and "argument 'x-subscription' must be a string, got 7" in reply.description
