"""HA's metrics: the epoch, failovers seen, the cluster's size, and on a primary whether it can confirm
publishes (enough brokers hold them), and each backup's state, lag, confirmations and drops for timeout
(design/metrics.md)."""
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
    # on a primary: min_confirmations, holders, confirming, waiting, messages adopted from rejoining backups
    floor: tuple[int, int, bool, int, int] | None = None
    diverged: tuple[int, int] = (0, 0)  # messages kept aside since start, and in diverged files now


class HaSource:
    def __init__(self, ha: "HaBroker") -> None:
        self.ha = ha

    def sample(self) -> HaSample:
        ha, primary = self.ha, self.ha.primary
        backups: list[BackupSample] = []
        floor = None
        if primary is not None:
            waiting = primary.quorums.waiting() if primary.quorums is not None else 0
            floor = (primary.needed, primary.holders(), primary.confirming(), waiting, primary.adoptions.total)
            now = time.monotonic()
            for name, counters in sorted(primary.counters.items()):
                b = primary.backups.get(name)
                backups.append(BackupSample(name, DISCONNECTED, None, None, counters.confirmed, counters.timeout_drops)
                               if b is None else BackupSample(name, b.state, b.lag, b.lag_seconds(now),
                                                              counters.confirmed, counters.timeout_drops))
        quarantine = ha.backup.quarantine
        diverged = (quarantine.kept, int(quarantine.status()["messages"]))
        return HaSample(ha.epoch.epoch, ha.failovers_seen, len(ha.config.brokers), backups, floor, diverged)

    def families(self, s: HaSample) -> Iterable[Metric]:
        yield GaugeMetricFamily("haqueue_epoch", "The highest cluster epoch this broker has seen", value=s.epoch)
        yield CounterMetricFamily("haqueue_failovers_seen", "Times this broker saw a new primary take over from "
                                  "another (the epoch rose) since it started", value=s.failovers_seen)
        yield GaugeMetricFamily("haqueue_cluster_brokers", "Brokers in the cluster (ha.brokers)", value=s.brokers)
        yield CounterMetricFamily("haqueue_ha_diverged_kept", "Messages this broker held that a new primary never "
                                  "had, kept aside in its diverged files (not deleted) since it started",
                                  value=s.diverged[0])
        yield GaugeMetricFamily("haqueue_ha_diverged_messages", "Messages in this broker's diverged files, not yet "
                                "republished (haqueue diverged list)", value=s.diverged[1])
        if s.floor is not None:
            needed, holders, confirming, waiting, adopted = s.floor
            yield GaugeMetricFamily("haqueue_ha_min_confirmations", "On the primary: brokers that must hold a "
                                    "message before it is confirmed (ha.min_confirmations)", value=needed)
            yield GaugeMetricFamily("haqueue_ha_holders", "On the primary: brokers holding every new message "
                                    "(this one and its ready backups)", value=holders)
            yield GaugeMetricFamily("haqueue_ha_confirming", "On the primary: 1 while publishes can be confirmed, "
                                    "0 while they wait for enough brokers to hold them", value=int(confirming))
            yield GaugeMetricFamily("haqueue_ha_publishes_waiting", "On the primary: publishes waiting for enough "
                                    "brokers to hold them", value=waiting)
            yield CounterMetricFamily("haqueue_ha_adopted", "On the primary: messages rejoining backups held that "
                                      "it never had, adopted since it was promoted", value=adopted)
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
