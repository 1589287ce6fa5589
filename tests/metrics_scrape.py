"""Scraping a broker's metrics endpoint in tests, as Prometheus would: HTTP GET /metrics, parsed by
prometheus_client's own text-format parser.

`scrape(address)`  every sample as {(name, ((label, value), ...)): value}; `value(...)` one of them.
`families(address)` every metric family: {name: (type, sorted label names)}, for checking the docs.
"""
from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(address: str, path: str = "/metrics", timeout: float = 10.0) -> tuple[int, str]:
    """(HTTP status, body) of a GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _parsed(address: str):
    status, text = get(address)
    assert status == 200, f"GET http://{address}/metrics: {status} {text[:300]}"
    return list(text_string_to_metric_families(text))


def scrape(address: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in _parsed(address) for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def families(address: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each family by its name as exposed (counters with _total), with its type and label names."""
    found = {}
    for f in _parsed(address):
        name = f.name + "_total" if f.type == "counter" else f.name
        labels = {k for s in f.samples for k in s.labels if k != "le"}
        found[name] = (f.type, tuple(sorted(labels)))
    return found
