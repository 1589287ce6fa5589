"""Helpers shared by the sources' metric families."""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


def state_set(name: str, help_: str, labels: list[str], keys: list[list[str]], label: str,
              values: tuple[str, ...], current: list[str]) -> GaugeMetricFamily:
    """For each key (the values of `labels`), one series per possible value of `label`, 1 for that key's
    current value and 0 for the others: the series stay put when the value changes."""
    gauge = GaugeMetricFamily(name, help_, labels=[*labels, label])
    for key, now in zip(keys, current):
        for value in values:
            gauge.add_metric([*key, value], int(value == now))
    return gauge
