"""Metrics of a hot-standby cluster (design/metrics.md): the primary's view of each backup (state, lag,
confirmations, drops for timeout), roles and failovers seen, and the documented names are the exported
ones. Real brokers, each serving /metrics on its own port."""
from __future__ import annotations

import threading

import pytest

from haqueue import __version__
from haqueue.ha.protocol import PROTOCOL

from ha_harness import send_all, wait_for, with_metrics
from metrics_scrape import families, scrape, value
from monitoring_files import dashboard_queries, documented, metric_names, rule_queries

pytestmark = pytest.mark.timeout(120)

def test_primary_shows_backups_lag_confirmations_and_drops(ha_cluster):
    c = ha_cluster(backup_timeout=4.0)
    metrics = with_metrics(c)
    p = c.start_cluster()
    m = metrics[p.name]
    samples = scrape(m)
    assert value(samples, "haqueue_role", role="primary") == 1
    assert value(samples, "haqueue_epoch") == 1
    assert value(samples, "haqueue_cluster_brokers") == 3
    for b in ("b1", "b2"):
        assert value(samples, "haqueue_backup_state", backup=b, state="ready") == 1
        assert value(samples, "haqueue_backup_state", backup=b, state="catchup") == 0
    backup = scrape(metrics["b1"])
    assert value(backup, "haqueue_role", role="backup") == 1 and value(backup, "haqueue_state", state="ready") == 1
    assert value(backup, "haqueue_build_info", version=__version__, protocol=str(PROTOCOL)) == 1

    c.request(p, "CREATE", "queue", "q")
    for b in c.brokers[1:]:  # subscribed: what follows is live replication, each message confirmed
        c.wait_ready(b, queues=["q"])
    send_all(c.public, "q", range(40))
    samples = scrape(m)
    for b in ("b1", "b2"):  # each publish was confirmed by both backups before it was settled
        assert value(samples, "haqueue_backup_confirmed_total", backup=b) >= 40
        assert value(samples, "haqueue_backup_lag_messages", backup=b) == 0
    assert value(samples, "haqueue_queue_depth", queue="q") == 40
    c.wait_depth(c[1], "q", 40)
    assert value(scrape(metrics["b1"]), "haqueue_queue_enqueued_total", queue="q") == 40

    # a stalled backup: its lag grows in messages and seconds until the primary drops it
    c.sigstop(c[2])
    sender = threading.Thread(target=send_all, args=(c.public, "q", range(40, 45)), daemon=True)
    sender.start()
    wait_for(lambda: (value(s := scrape(m), "haqueue_backup_lag_seconds", backup="b2") or 0) >= 0.5
             and value(s, "haqueue_backup_lag_messages", backup="b2") >= 1, 4, message="b2's lag on the scrape")
    assert value(scrape(m), "haqueue_backup_lag_seconds", backup="b1") < 0.5
    wait_for(lambda: value(scrape(m), "haqueue_backup_timeout_drops_total", backup="b2") == 1, 10,
             message="b2 dropped for timeout")
    samples = scrape(m)
    assert value(samples, "haqueue_backup_state", backup="b2", state="disconnected") == 1
    assert value(samples, "haqueue_backup_lag_seconds", backup="b2") is None  # no lag without a connection
    sender.join(10)
    c.sigcont(c[2])
    wait_for(lambda: value(scrape(m), "haqueue_backup_state", backup="b2", state="ready") == 1, 15,
             message="b2 ready again on the scrape")
    assert value(scrape(m), "haqueue_backup_timeout_drops_total", backup="b2") == 1  # the count outlives it
    assert {b["name"]: b["timeout_drops"] for b in c.status(p)["backups"]} == {"b1": 0, "b2": 1}  # admin ha status too


def test_failover_is_seen_and_the_docs_name_every_metric(ha_cluster):
    c = ha_cluster()
    metrics = with_metrics(c)
    p = c.start_cluster()
    send_all(c.public, "q", range(3))
    for b in c:
        assert value(scrape(metrics[b.name]), "haqueue_failovers_seen_total") == 0  # a new cluster's first primary
    c.kill(p)
    c.promote(c[1])
    c.wait_ready(c[2])
    new = scrape(metrics["b1"])
    assert value(new, "haqueue_role", role="primary") == 1 and value(new, "haqueue_epoch") == 2
    assert value(new, "haqueue_failovers_seen_total") == 1
    wait_for(lambda: value(scrape(metrics["b2"]), "haqueue_failovers_seen_total") == 1, 10,
             message="b2 saw the failover")
    c.wait_backups_ready(c[1], ["b2"])
    # every family a primary with a store, a queue and a backup exports is documented, and no more
    exported = families(metrics["b1"])
    doc = {name: kind for name, kind in documented().items()
           if not name.startswith("haqueue_mirror_")}  # a mirror's alone: tests/mirror/test_mirror_metrics.py
    assert set(exported) == set(doc), f"exported only: {set(exported) - set(doc)}; documented only: " \
                                      f"{set(doc) - set(exported)}"
    for name, (type_, labels) in exported.items():
        assert doc[name] == (type_, labels), (name, exported[name], doc[name])
    # and packaging/'s dashboard and alert rules read only these
    for queries in (dashboard_queries(), rule_queries()):
        used = metric_names(queries, set(exported))
        assert used <= set(exported), used - set(exported)
