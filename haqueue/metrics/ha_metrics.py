"""HA's metrics: the epoch, failovers seen, the cluster's size, and on a primary each backup's state, lag,
confirmations and drops for timeout (design/metrics.md)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from .families import state_set

if TYPE_CHECKING:
    from ..ha.ha_broker import HaBroker

BACKUP_STATES = ("catchup", "ready", "disconnected")
DISCONNECTED = "disconnected"  # a backup seen by this primary that has no connection to it now

# name, state, lag in messages, lag in seconds, confirmed, timeout drops (a disconnected backup: no lag)
BackupSample = tuple[str, str, int | None, float | None, int, int]


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
                backups.append((name, DISCONNECTED, None, None, counters.confirmed, counters.timeout_drops)
                               if b is None else
                               (name, b.state, b.lag, b.lag_seconds(now), counters.confirmed, counters.timeout_drops))
        return HaSample(ha.epoch.epoch, ha.failovers_seen, len(ha.config.brokers), backups)

    def families(self, s: HaSample) -> Iterable[Metric]:
        yield GaugeMetricFamily("haqueue_epoch", "The highest cluster epoch this broker has seen", value=s.epoch)
        yield CounterMetricFamily("haqueue_failovers_seen", "Times this broker saw a new primary take over from "
                                  "another (the epoch rose) since it started", value=s.failovers_seen)
        yield GaugeMetricFamily("haqueue_cluster_brokers", "Brokers in the cluster (ha.brokers)", value=s.brokers)
        names = [[b[0]] for b in s.backups]
        yield state_set("haqueue_backup_state", "On the primary, per backup: 1 for its state (catchup, ready, "
                        "disconnected), 0 for the others", ["backup"], names, "state", BACKUP_STATES,
                        [b[1] for b in s.backups])
        connected = [b for b in s.backups if b[2] is not None]
        lag = GaugeMetricFamily("haqueue_backup_lag_messages", "On the primary, per connected backup: messages it "
                                "does not have yet (unconfirmed, unsent, catch-up left)", labels=["backup"])
        seconds = GaugeMetricFamily("haqueue_backup_lag_seconds", "On the primary, per connected backup: how long "
                                    "the oldest live message sent to it has waited for its confirmation",
                                    labels=["backup"])
        for b in connected:
            lag.add_metric([b[0]], b[2])  # type: ignore[arg-type]
            seconds.add_metric([b[0]], b[3])  # type: ignore[arg-type]
        yield lag
        yield seconds
        confirmed = CounterMetricFamily("haqueue_backup_confirmed", "On the primary, per backup: live messages it "
                                        "confirmed", labels=["backup"])
        drops = CounterMetricFamily("haqueue_backup_timeout_drops", "On the primary, per backup: times it was "
                                    "dropped for not confirming within ha.backup_timeout", labels=["backup"])
        for b in s.backups:
            confirmed.add_metric([b[0]], b[4])
            drops.add_metric([b[0]], b[5])
        yield confirmed
        yield drops
