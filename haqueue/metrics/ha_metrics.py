"""HA's metrics: the epoch, failovers seen, the cluster's size, and on a primary each backup's state, lag,
confirmations and drops for timeout (design/metrics.md)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ..ha.role import CATCHUP, READY
from .families import state_set

if TYPE_CHECKING:
    from ..ha.ha_broker import HaBroker

DISCONNECTED = "disconnected"  # a backup seen by this primary that has no connection to it now
BACKUP_STATES = (CATCHUP, READY, DISCONNECTED)


class BackupSample(NamedTuple):
    name: str
    state: str
    lag: int | None  # messages; None: disconnected
    lag_seconds: float | None
    confirmed: int
    timeout_drops: int


@dataclass(slots=True)
class HaSample:
    epoch: int
    failovers_seen: int
    brokers: int
    backups: list[BackupSample]  # on a primary: every backup seen while primary


class HaSource:
    def __init__(self, ha: "HaBroker") -> None:
        self.ha = ha

    def sample(self) -> HaSample:
        ha, primary = self.ha, self.ha.primary
        backups: list[BackupSample] = []
        if primary is not None:
            now = time.monotonic()
            for name, counters in sorted(primary.counters.items()):
                b = primary.backups.get(name)
                backups.append(BackupSample(name, DISCONNECTED, None, None, counters.confirmed, counters.timeout_drops)
                               if b is None else BackupSample(name, b.state, b.lag, b.lag_seconds(now),
                                                              counters.confirmed, counters.timeout_drops))
        return HaSample(ha.epoch.epoch, ha.failovers_seen, len(ha.config.brokers), backups)

    def families(self, s: HaSample) -> Iterable[Metric]:
        yield GaugeMetricFamily("haqueue_epoch", "The highest cluster epoch this broker has seen", value=s.epoch)
        yield CounterMetricFamily("haqueue_failovers_seen", "Times this broker saw a new primary take over from "
                                  "another (the epoch rose) since it started", value=s.failovers_seen)
        yield GaugeMetricFamily("haqueue_cluster_brokers", "Brokers in the cluster (ha.brokers)", value=s.brokers)
        yield state_set("haqueue_backup_state", "On the primary, per backup: 1 for its state (catchup, ready, "
                        "disconnected), 0 for the others", ["backup"], [[b.name] for b in s.backups], "state",
                        BACKUP_STATES, [b.state for b in s.backups])
        lag = GaugeMetricFamily("haqueue_backup_lag_messages", "On the primary, per connected backup: messages it "
                                "does not have yet (unconfirmed, unsent, catch-up left)", labels=["backup"])
        seconds = GaugeMetricFamily("haqueue_backup_lag_seconds", "On the primary, per connected backup: how long "
                                    "the oldest live message sent to it has waited for its confirmation",
                                    labels=["backup"])
        for b in s.backups:
            if b.lag is not None and b.lag_seconds is not None:
                lag.add_metric([b.name], b.lag)
                seconds.add_metric([b.name], b.lag_seconds)
        yield lag
        yield seconds
        confirmed = CounterMetricFamily("haqueue_backup_confirmed", "On the primary, per backup: live messages it "
                                        "confirmed", labels=["backup"])
        drops = CounterMetricFamily("haqueue_backup_timeout_drops", "On the primary, per backup: times it was "
                                    "dropped for not confirming within ha.backup_timeout", labels=["backup"])
        for b in s.backups:
            confirmed.add_metric([b.name], b.confirmed)
            drops.add_metric([b.name], b.timeout_drops)
        yield confirmed
        yield drops
