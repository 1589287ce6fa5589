"""The metrics design/metrics.md documents; the queries of packaging/'s Grafana dashboard and Prometheus
rules, and the metric names they use."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "design" / "metrics.md"
PACKAGING = ROOT / "packaging"
DASHBOARD = PACKAGING / "grafana-dashboard.json"
RULES = PACKAGING / "prometheus-rules.yml"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each metric of design/metrics.md's tables (| `name` | type | `label` `label` | meaning |): its type and
    sorted label names."""
    rows = {}
    for name, type_, labels in re.findall(r"^\| `(haqueue_\w+)` \| (\w+) \| ([^|]*)\|", DOC.read_text(), re.M):
        rows[name] = (type_, tuple(sorted(re.findall(r"`(\w+)`", labels))))
    return rows


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def rule_queries() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def metric_names(queries: list[str], families: set[str]) -> set[str]:
    """The haqueue families the queries read (a histogram's _bucket, _sum and _count are its family's)."""
    names = set()
    for name in re.findall(r"\bhaqueue_\w+", "\n".join(queries)):
        base = next((name[:-len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s) and name[:-len(s)] in families),
                    name)
        names.add(base)
    return names
