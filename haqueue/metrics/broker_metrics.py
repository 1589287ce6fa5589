"""The broker's own metrics: role and state, connections, links, held publishers, memory, and per queue
its depth, bytes, consumers, limits and totals (design/metrics.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from .. import __version__
from ..release import build_of
from .families import state_set

if TYPE_CHECKING:
    from ..broker.server import Broker

ROLES = ("standalone", "primary", "backup")
STATES = ("active", "recovering", "joining", "catchup", "ready")
# (name without haqueue_queue_, help) of each per-queue value, in the order QueueSample holds them
QUEUE_GAUGES = (("depth", "Messages on the queue (in memory or paged)"),
                ("bytes", "Bytes of message data on the queue"),
                ("consumers", "Consumers and browsers attached to the queue"),
                ("max_depth", "The queue's max_depth limit (0: none)"),
                ("max_bytes", "The queue's max_bytes limit (0: none)"),
                ("scheduled", "Messages held back until their x-opt-delivery-time (counted in depth)"))
QUEUE_COUNTERS = (("enqueued", "Messages that came onto the queue: published, replicated, recovered"),
                  ("dequeued", "Messages that left the queue for any reason (consumed, expired, dropped, "
                               "dead-lettered, purged)"),
                  ("expired", "Messages whose time to live ran out on the queue"),
                  ("dead_lettered", "Rejected messages sent on to the queue's dead-letter address"),
                  ("poisoned", "Messages taken out after x-max-deliveries failed deliveries (dead-lettered or "
                               "dropped)"),
                  ("dropped", "Messages dropped from the head to make room (overflow drop-head)"),
                  ("kept_local", "Messages a primary kept off its backups (x-replicate: false, or transient under "
                                 "x-replicate: durable)"))

QueueSample = tuple[str, tuple[int, ...]]  # name, then the values of QUEUE_GAUGES and QUEUE_COUNTERS in order


@dataclass(slots=True)
class BrokerSample:
    name: str
    protocol: int  # the newest replication protocol it speaks
    role: str
    state: str
    connections: int
    links: int
    blocked_publishers: int
    memory_used: int
    memory_limit: int
    memory_alarm: bool
    queue_count: int
    queues: list[QueueSample]


class BrokerSource:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def sample(self) -> BrokerSample:
        broker = self.broker
        status = broker.status()  # role and state: HA's, through the broker's status hooks
        queues = broker.registry.queues()
        blocked = set(broker.memory.held).union(*(q.blocker.held for q in queues))
        return BrokerSample(
            broker.name, build_of(status).newest, status["role"], status["state"], len(broker.connections), len(broker.engine.links),
            len(blocked), broker.memory.used, broker.memory.configured, broker.memory.on, len(queues),
            # Temporary queues (a link's own: reply queues, exchange subscriptions) come and go with their
            # links: as series they would only churn. They count in haqueue_queues.
            [(q.name, (q.depth, q.bytes, len(q.consumers) + len(q.browsers), q.max_depth, q.max_bytes,
                       q.deferred, q.enqueued, q.dequeued, q.expired, q.dead_lettered, q.poisoned, q.dropped,
                       q.kept_local))
             for q in queues if not q.temporary])

    def families(self, s: BrokerSample) -> Iterable[Metric]:
        info = GaugeMetricFamily("haqueue_broker_info", "The broker's name and version (always 1)",
                                 labels=["broker", "version"])
        info.add_metric([s.name, __version__], 1)
        yield info
        build = GaugeMetricFamily("haqueue_build_info", "The release and the newest replication protocol it speaks "
                                  "(always 1)", labels=["version", "protocol"])
        build.add_metric([__version__, str(s.protocol)], 1)
        yield build
        yield state_set("haqueue_role", "1 for the broker's role (standalone, primary, backup), 0 for the others",
                        [], [[]], "role", ROLES, [s.role])
        yield state_set("haqueue_state", "1 for the broker's state in its role, 0 for the others", [], [[]],
                        "state", STATES, [s.state])
        yield GaugeMetricFamily("haqueue_connections", "Client and peer connections open", value=s.connections)
        yield GaugeMetricFamily("haqueue_links", "Links attached (clients', peers', management's)", value=s.links)
        yield GaugeMetricFamily("haqueue_publishers_blocked",
                                "Publisher links given no credit until a full queue drains or the memory alarm "
                                "clears (overflow block)", value=s.blocked_publishers)
        yield GaugeMetricFamily("haqueue_memory_used_bytes", "Bytes of message data in memory in all queues",
                                value=s.memory_used)
        yield GaugeMetricFamily("haqueue_memory_limit_bytes", "limits.memory_limit (0: none)", value=s.memory_limit)
        yield GaugeMetricFamily("haqueue_memory_alarm", "1 while the memory alarm holds publishers",
                                value=int(s.memory_alarm))
        yield GaugeMetricFamily("haqueue_queues", "Queues, temporary ones included", value=s.queue_count)
        for i, (name, help_) in enumerate(QUEUE_GAUGES):
            gauge = GaugeMetricFamily(f"haqueue_queue_{name}", help_, labels=["queue"])
            for queue, values in s.queues:
                gauge.add_metric([queue], values[i])
            yield gauge
        for i, (name, help_) in enumerate(QUEUE_COUNTERS, start=len(QUEUE_GAUGES)):
            counter = CounterMetricFamily(f"haqueue_queue_{name}", help_, labels=["queue"])
            for queue, values in s.queues:
                counter.add_metric([queue], values[i])
            yield counter

