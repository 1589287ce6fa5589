"""A source cluster under Pacemaker mirrors to a standby (design/mirroring.md): the three-node cluster of
pcmk_cluster.py, each broker's `mirror:` section naming the standby through the delaying relay (25 ms each way,
tests/mirror/delay_relay.py), which listens on the bridge's address of the root namespace, where the standby
broker runs. Its primary is killed (-9) under load through the VIP; Pacemaker promotes another and moves the VIP,
and the new primary resumes the mirror from what the standby holds: once the clients stop and the lag drains, the
standby holds exactly what the source holds, in order, and the clients' ledger agrees.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ha_harness import browse
from harness import BrokerProcess, unexpected_exits, wait_for
from pcmk_cluster import HOST_ADDRESS, VIP_ADDRESS, Node, PacemakerCluster, running

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mirror"))
from delay_relay import DelayRelay  # noqa: E402
from mirror_harness import MIRROR_PASSWORD, MIRROR_USER, SITE_DELAY, Side, standby_config  # noqa: E402

pytestmark = pytest.mark.timeout(300)

QUEUES = ["orders.0", "orders.1"]  # mirrored (orders.*): a producer on each, a consumer on the first
LAG_TIMEOUT = 30.0


class MirroredCluster(PacemakerCluster):
    """The test cluster as a mirror's source (cluster `site-a`): the relay to the standby is made once the bridge
    is up (its address is the relay's), before the nodes' configs are written."""

    def __init__(self, standby: str) -> None:
        super().__init__()
        host, port = standby.rsplit(":", 1)
        self.standby = (host, int(port))
        self.relay: DelayRelay | None = None

    def _network(self) -> None:
        super()._network()
        self.relay = DelayRelay(self.standby, SITE_DELAY, host=HOST_ADDRESS)

    def write_broker_configs(self, node: Node) -> None:
        super().write_broker_configs(node)
        assert self.relay is not None
        path = node.dir("etc-haqueue") / "haqueue.yaml"
        config = yaml.safe_load(path.read_text())
        config["mirror"] = {"cluster": "site-a", "to": [self.relay.address], "username": MIRROR_USER,
                            "password": MIRROR_PASSWORD, "queues": ["orders.*"]}
        self.write_broker_config(node, path.name, config)

    def destroy(self) -> None:
        super().destroy()
        if self.relay is not None:
            self.relay.close()

    def mirror(self, node: Node) -> dict[str, Any]:
        """The source's part of the node's `admin mirror status`."""
        with self.admin(node) as client:
            code, description, answer = client.request("READ", "mirror")
        assert code == 200, description
        return answer["source"]


@pytest.fixture(scope="module")
def standby(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("standby"), standby_config(), name="standby").start()
    yield broker
    crashed = unexpected_exits([broker])
    broker.stop()
    print(broker.log()[-4000:])
    assert not crashed, crashed


@pytest.fixture(scope="module")
def source(standby):
    yield from running(lambda: MirroredCluster(standby.address), lambda cluster: cluster.wait_healthy(90))


def mirrored(cluster: MirroredCluster, node: Node, drained: bool) -> bool:
    """The node's broker mirrors both queues, connected, the standby having confirmed a transfer of each from it;
    with `drained`, nothing waits."""
    status = cluster.mirror(node)
    return status["active"] and status["connected"] and [q["queue"] for q in status["queues"]] == QUEUES and all(
        q["state"] == "mirroring" and q["last_mirrored_seq"] > 0 and (q["lag_messages"] == 0 or not drained)
        for q in status["queues"])


def test_a_source_under_pacemaker_fails_over_and_its_new_primary_resumes_the_mirror(source, standby) -> None:
    old = source.wait_healthy(90)
    producers = {q: Side(VIP_ADDRESS, q, producer=True).start() for q in QUEUES}
    consumer = Side(VIP_ADDRESS, QUEUES[0], producer=False).start()
    try:
        wait_for(lambda: all(p.confirmed_count() >= 30 for p in producers.values()) and
                 mirrored(source, old, drained=False), LAG_TIMEOUT, message="mirrored under load")
        os.kill(source.broker_pid(old), signal.SIGKILL)
        new = source.wait_new_primary(old, timeout=30)
        more = {q: p.confirmed_count() + 30 for q, p in producers.items()}
        wait_for(lambda: all(producers[q].confirmed_count() >= n for q, n in more.items()) and
                 mirrored(source, new, drained=False), LAG_TIMEOUT,
                 message="the clients served and the mirror resumed by the new primary")
    finally:
        for side in [*producers.values(), consumer]:
            side.stop()
    wait_for(lambda: mirrored(source, new, drained=True), LAG_TIMEOUT, message="the mirror's lag drains")
    taken = set(consumer.received)
    for queue, producer in producers.items():
        at_source = [m.body for m in browse(VIP_ADDRESS, queue, source.queue_depth(new, queue) or 0)]
        at_standby = [m.body for m in browse(standby.address, queue, len(at_source))] if at_source else []
        assert at_standby == at_source == sorted(at_source), queue
        held = set(at_source)  # the ledger: each confirmed message not consumed is there (a retried one maybe twice)
        assert [b for b in producer.confirmed if b not in taken and b not in held] == [], queue
        assert held <= set(producer.confirmed) | {producer.next}, queue
