"""A real Prometheus server (Debian's `prometheus`) scraping a 3-broker cluster: the question an operator
asks it, "what is the largest replication lag across the backups?", answered by PromQL over its HTTP API
while a backup is stalled. Slow: it runs Prometheus and waits for its scrapes."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from ha_harness import free_port, send_all, wait_for, with_metrics
from metrics_scrape import get
from monitoring_files import RULES, dashboard_queries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PROMETHEUS = shutil.which("prometheus")


class Prometheus:
    """A Prometheus server on a free loopback port scraping `targets` every second, its config and data in
    `directory`."""

    def __init__(self, directory: Path, targets: list[str], rule_files: list[Path] = ()) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
                  "rule_files": [str(f) for f in rule_files],
                  "scrape_configs": [{"job_name": "haqueue", "static_configs": [{"targets": targets}]}]}
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address={self.address}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(self._ready, 30, message=f"prometheus ready on {self.address}")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            return get(self.address, "/-/ready", timeout=1)[0] == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.api("query", query=promql)["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def prometheus(tmp_path) -> Iterator[Any]:
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (Debian's prometheus package; make setup installs it)")
    started: list[Prometheus] = []

    def start(targets: list[str], rule_files: list[Path] = ()) -> Prometheus:
        server = Prometheus(tmp_path, targets, rule_files)
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


def test_prometheus_answers_the_largest_replication_lag(ha_cluster, prometheus):
    c = ha_cluster(backup_timeout=20.0)
    metrics = with_metrics(c)
    p = c.start_cluster()
    prom = prometheus(list(metrics.values()), [RULES])
    wait_for(lambda: len([r for r in prom.query("up == 1")]) == 3, 20, message="prometheus scraping 3 brokers")
    send_all(c.public, "q", range(20))
    wait_for(lambda: prom.query("max(haqueue_backup_lag_messages)") and
             float(prom.query("max(haqueue_backup_lag_messages)")[0]["value"][1]) == 0, 20,
             message="no lag while every backup keeps up")

    # b2 stalls: what it has not confirmed waits, and the lag Prometheus sees grows
    c.sigstop(c[2])
    threading.Thread(target=send_all, args=(c.public, "q", range(20, 25)), kwargs={"timeout": 40},
                     daemon=True).start()

    def largest_lag() -> list[dict[str, Any]] | None:
        found = prom.query("topk(1, max by (backup) (haqueue_backup_lag_seconds))")
        return found if found and float(found[0]["value"][1]) >= 2 else None
    top = wait_for(largest_lag, 20, message="prometheus seeing b2 lag 2 s or more")
    assert top[0]["metric"]["backup"] == "b2", top
    lag = float(prom.query("max(haqueue_backup_lag_seconds)")[0]["value"][1])
    assert lag >= 2
    assert float(prom.query("max(haqueue_backup_lag_messages)")[0]["value"][1]) >= 1
    assert float(prom.query('max(haqueue_backup_lag_seconds{backup="b1"})')[0]["value"][1]) < 2
    # only the primary has backup series: the max across every scraped broker is its own
    instances = {r["metric"]["instance"] for r in prom.query("haqueue_backup_lag_seconds")}
    assert instances == {metrics[p.name]}, instances
    c.sigcont(c[2])

    # packaging/'s alert rules load and evaluate against these series without error, and so do the
    # dashboard's queries
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert rules and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    for query in dashboard_queries():
        prom.query(query.replace("$__rate_interval", "1m"))
