"""The store's metrics: the journal's size, whether it can write, and how long its syncs take
(design/metrics.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from ..store.sync_latency import BOUNDS

if TYPE_CHECKING:
    from ..store.store import Store


@dataclass(slots=True)
class StoreSample:
    bytes: int
    segments: int
    failing: bool
    sync_counts: list[int]  # per bucket of BOUNDS, then over them
    sync_seconds: float


class StoreSource:
    def __init__(self, store: "Store") -> None:
        self.store = store

    def sample(self) -> StoreSample:
        store, writer = self.store, self.store.writer
        sizes = store.sizes
        if writer is None:  # not recovered yet
            return StoreSample(sum(sizes.values()), len(sizes), False, [0] * (len(BOUNDS) + 1), 0.0)
        # The writer thread counts syncs as they end; list() copies the counts at once (under the GIL), and
        # the total may lack the one sync ending meanwhile: the buckets stay consistent with their count.
        latency = writer.latency
        return StoreSample(sum(sizes.values()), len(sizes), writer.failing is not None, list(latency.counts),
                           latency.seconds)

    def families(self, s: StoreSample) -> Iterable[Metric]:
        yield GaugeMetricFamily("haqueue_journal_bytes", "Bytes in the journal's segments", value=s.bytes)
        yield GaugeMetricFamily("haqueue_journal_segments", "The journal's segment files", value=s.segments)
        yield GaugeMetricFamily("haqueue_journal_failing", "1 while the disk refuses the journal's writes (durable "
                                "publishes are not confirmed meanwhile)", value=int(s.failing))
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, BOUNDS), "+Inf"], s.sync_counts):
            cumulative += count
            buckets.append((bound, cumulative))
        histogram = HistogramMetricFamily("haqueue_journal_fsync_seconds", "How long the journal's fdatasync calls "
                                          "take (one per group commit)", labels=[])
        histogram.add_metric([], buckets, s.sync_seconds)
        yield histogram
