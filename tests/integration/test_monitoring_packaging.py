"""packaging/'s Grafana dashboard and Prometheus alert rules: Prometheus' own checker accepts them, and
they read only metrics the broker documents (tests/ha/test_ha_metrics.py checks those against what a
running cluster exports)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring_files import RULES, dashboard_queries, documented, metric_names, rule_queries

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package)")


def promtool_check_rules(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    p = promtool_check_rules(RULES)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    # Grafana's $__rate_interval is a range; as recording rules, promtool parses each query
    queries = [q.replace("$__rate_interval", "1m") for q in dashboard_queries()]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": q}
                                                        for i, q in enumerate(queries)]}]}
    (tmp_path / "dashboard-queries.yml").write_text(yaml.safe_dump(rules))
    p = promtool_check_rules(tmp_path / "dashboard-queries.yml")
    assert p.returncode == 0, p.stdout + p.stderr


def test_dashboard_and_rules_read_only_documented_metrics():
    doc = set(documented())
    for what, queries in (("dashboard", dashboard_queries()), ("rules", rule_queries())):
        used = metric_names(queries, doc)
        assert used and used <= doc, f"{what} reads metrics the broker does not export: {used - doc}"
