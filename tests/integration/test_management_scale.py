"""Management at scale (design/management.md, "QUERY pages", "Flow control of requests"): `admin queue list`
lists 20,000 queues page by page, with `--filter`, `--offset` and `--limit`; a burst of pipelined requests on
one connection is flow-controlled and takes turns, so another connection's ping is answered meanwhile."""
from __future__ import annotations

import json
import threading

import pytest
from proton import Message

from clients import Client
from harness import BrokerProcess, run_haqueue
from haqueue.admin import AdminClient
from haqueue.broker.management import WINDOW

pytestmark = pytest.mark.timeout(120)

QUEUES = [f"q-{i:05d}" for i in range(20_000)]


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A broker started with 20,000 queues from its config."""
    b = BrokerProcess(tmp_path_factory.mktemp("scale"), {"queues": [{"name": q} for q in QUEUES]}, name="many",
                      port_retries=3)
    b.start(timeout=60)
    yield b
    b.stop()
    print(b.log()[-5000:])


def queue_list(broker: BrokerProcess, *options: str) -> list[str]:
    """The names `admin queue list` prints, but the temporary (the admin client's own reply queue)."""
    p = run_haqueue(["admin", "-b", broker.address, "queue", "list", *options], timeout=60)
    assert p.returncode == 0, p.stderr
    return [q["name"] for q in map(json.loads, p.stdout.splitlines()) if not q["temporary"]]


def test_queue_list_prints_every_queue_in_name_order(many):
    assert queue_list(many) == QUEUES


def test_queue_list_filter(many):
    assert queue_list(many, "--filter", "q-1999*") == [f"q-{i:05d}" for i in range(19_990, 20_000)]
    assert queue_list(many, "--filter", "q-0?000") == [f"q-0{i}000" for i in range(10)]
    assert queue_list(many, "--filter", "nothing*") == []


def test_queue_list_offset_and_limit_give_disjoint_pages_that_make_up_the_whole(many):
    pages = [queue_list(many, "--filter", "q-*", "--offset", str(offset), "--limit", "7000")
             for offset in (0, 7000, 14000)]  # filtered: the admin client's own reply queue would be among them
    assert [len(page) for page in pages] == [7000, 7000, 6000]
    assert sum(pages, []) == QUEUES


def test_admin_client_pages_say_the_total_and_where_the_next_starts(many):
    with AdminClient(many.address) as client:
        first = client.query_page("queue", count=3, filter="q-0000*")
        assert [q["name"] for q in first.items] == ["q-00000", "q-00001", "q-00002"]
        assert first.total == 10 and first.next is not None
        rest = client.query_page("queue", filter="q-0000*", after=first.next)
        assert [q["name"] for q in rest.items] == [f"q-{i:05d}" for i in range(3, 10)]
        assert rest.next is None
        assert [q["name"] for q in client.query("queue", "q-1*", offset=5, limit=3)] == \
            ["q-10005", "q-10006", "q-10007"]


def test_a_burst_of_creates_is_flow_controlled_and_another_connection_is_answered_meanwhile(broker):
    burst = 1000
    outcome: dict[str, object] = {}

    def flood() -> None:
        with Client(broker, timeout=30) as c:
            sender = c.sender("$management")
            replies = c.receiver(None, dynamic=True, credit=burst)
            c.wait(lambda: sender.link.credit > 0, what="credit on $management")
            outcome["window"] = sender.link.credit
            for i in range(burst):  # proton holds what the credit does not cover yet
                sender.link.send(Message(id=i, reply_to=replies.address, body={},
                                         properties={"operation": "CREATE", "type": "queue", "name": f"b-{i:04d}"}))
            answers = replies.receive_n(burst, timeout=60)
            outcome["statuses"] = {r.message.properties["statusCode"] for r in answers}

    flooding = threading.Thread(target=flood)
    pings = 0
    with AdminClient(broker.address, timeout=5) as pinger:  # each ping answered within 5 s, or AdminError
        flooding.start()
        while flooding.is_alive():
            assert pinger.request("READ", "broker")[0] == 200
            pings += 1
        flooding.join()
        assert outcome == {"window": WINDOW, "statuses": {201}}
        assert pings > 0
        assert pinger.query_page("queue", count=0, filter="b-*").total == burst
