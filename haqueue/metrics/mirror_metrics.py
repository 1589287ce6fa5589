"""The mirror's metrics (design/metrics.md, design/mirroring.md): on a source's primary the connection to the standby
and each mirrored queue's lag, bytes held back and backlog limit; on a standby each source's connection, the
mirror epoch, and the messages applied to each mirror queue. Read from the mirror's own status, the one `haqueue
admin mirror status` prints (management's `READ mirror`), so the two never disagree; a broker without a `mirror:`
section has no such operation and gets no source of these metrics at all."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

Status = dict[str, Any]  # READ mirror's answer: {"broker", "source", "standby"}
# (name without haqueue_mirror_, the status's key, help) of each per-queue value on a source
QUEUE_GAUGES = (("lag_messages", "lag_messages", "Messages on the queue the standby has not confirmed"),
                ("lag_seconds", "lag_seconds", "How long the oldest message the standby has not confirmed has "
                                               "waited (0: none waits)"),
                ("bytes_held_back", "bytes_held_back", "Bytes of the messages the standby has not confirmed"),
                ("backlog_limit_reached", "backlog_limit_reached", "1 from when the bytes held back pass "
                                                                   "mirror.max_backlog_bytes until they are back "
                                                                   "under 90 % of it"))


class MirrorMetrics:
    def __init__(self, status: Callable[[], Status]) -> None:
        self.status = status  # READ mirror's operation: a fresh dict of plain values at each call

    def sample(self) -> Status:
        return self.status()

    def families(self, s: Status) -> Iterable[Metric]:
        source, standby = s.get("source"), s.get("standby")
        # A backup of the source cluster mirrors nothing, nor does a standby's dormant source (until a reverse).
        if source is not None and source["active"] and not source.get("dormant"):
            yield GaugeMetricFamily("haqueue_mirror_connected", "On a source's primary: 1 while its mirror is "
                                    "connected to the standby", value=int(source["connected"]))
            for name, key, help_ in QUEUE_GAUGES:
                gauge = GaugeMetricFamily(f"haqueue_mirror_{name}", f"On a source's primary, per mirrored queue: "
                                          f"{help_}", labels=["queue"])
                for queue in source["queues"]:
                    gauge.add_metric([queue["queue"]], float(queue[key]))
                yield gauge
        if standby is not None:
            yield GaugeMetricFamily("haqueue_mirror_epoch", "On a standby: the highest mirror epoch it knows (its "
                                    "own once promoted)", value=standby["epoch"])
            yield GaugeMetricFamily("haqueue_mirror_promoted", "On a standby: 1 once it was promoted (its mirror "
                                    "queues writable)", value=int(standby["role"] == "promoted"))
            connected = GaugeMetricFamily("haqueue_mirror_source_connected", "On a standby, per source cluster seen "
                                          "since it started: 1 while that source mirrors into it",
                                          labels=["source"])
            for name, seen in standby["sources"].items():
                connected.add_metric([name], int(seen["connected"]))
            yield connected
            applied = CounterMetricFamily("haqueue_mirror_applied", "On a standby, per mirror queue and its source "
                                          "cluster: messages the mirror applied to it on this broker (its "
                                          "cluster's primary: a backup replicates them)", labels=["source", "queue"])
            for queue in standby["queues"]:
                applied.add_metric([str(queue["source"]), queue["queue"]], queue["applied"])
            yield applied


def mirror_metrics(operations: dict[tuple[str, str], tuple[Callable[..., Any], Any]]) -> MirrorMetrics | None:
    """The mirror's metrics, from management's `READ mirror` if the mirror plugged it in; else None."""
    operation = operations.get(("mirror", "READ"))
    if operation is None:
        return None
    read = operation[0]
    return MirrorMetrics(lambda: read(None, {})[1])
