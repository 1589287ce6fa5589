"""The web console of a sharded cluster (`haqueue cluster up --shards`) in a real browser: every process serves one,
printed as an unsharded cluster's are; the overview's shard map shows each shard's primary and its backups'
readiness; a queue of another shard is shown, figures, messages and all, by its shard's primary's console, which the
page follows from any other."""
from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from haqueue.shard.ownership import shard_of_name

from console_setup import click, http_json, nav, queue_rows, seen, text
from ha_harness import send_all, wait_for
from test_ha_supervisor import Supervised

pytestmark = pytest.mark.usefixtures("page_errors")

SHARDS = 2  # over 2 nodes (127.0.0.1, 127.0.0.2), 2 replicas each: shard i's preferred primary on node i + 1
QUEUE_OF_SHARD_1 = next(name for name in (f"orders-{i}" for i in range(100)) if shard_of_name(name, SHARDS) == 1)
MESSAGES = 5


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    s = Supervised(tmp_path_factory.mktemp("sharded") / "cluster", 2, args=("--shards", str(SHARDS)),
                   ports=2 * SHARDS)
    try:
        s.read_until("nodes ", 120)
        yield s
    finally:
        s.close()
        print("==== supervisor stderr ====\n" + s.stderr())


def test_every_process_serves_a_console_and_the_overview_maps_the_shards(sharded, browser, screenshot):
    consoles = sorted(line for line in sharded.seen if line.startswith("console "))
    assert consoles == sorted(f"console http://127.0.0.{node}:{sharded.console + shard}/ n{node}.s{shard}"
                              for node in (1, 2) for shard in range(SHARDS)), sharded.seen
    browser.get(f"http://127.0.0.1:{sharded.console}/")  # n1.s0's: anonymous clients need no login here

    def shard_map():
        rows = browser.find_elements(By.CSS_SELECTOR, "#shards tbody tr")
        primaries = {row.get_attribute("data-shard"): row.get_attribute("data-primary") for row in rows}
        ready = all(row.find_elements(By.TAG_NAME, "td")[-1].text.count(" ready") == 1 for row in rows)
        return primaries == {"0": "n1.s0", "1": "n2.s1"} and ready
    wait_for(seen(shard_map), 15, message="two shards, each with its preferred primary and a ready backup")
    assert text(browser, "brokers-title") == "Brokers of shard 0"
    screenshot("sharded-overview")


def test_a_queue_of_another_shard_is_shown_by_its_primarys_console(sharded, browser, screenshot):
    nodes = next(line for line in sharded.seen if line.startswith("nodes ")).split()[1:]
    send_all(nodes[0], QUEUE_OF_SHARD_1, list(range(MESSAGES)))  # at n1: relayed to shard 1's primary
    status, answer = http_json(f"127.0.0.1:{sharded.console}", "GET", f"/api/queues/{QUEUE_OF_SHARD_1}")
    assert (status, answer["console"]) == (421, f"http://127.0.0.2:{sharded.console + 1}/"), answer  # a script's

    nav(browser, "queues")
    wait_for(seen(lambda: Select(browser.find_element(By.ID, "queue-shard")).first_selected_option.text == "shard 0"
                  and "queues of shard 0, on n1.s0" in text(browser, "queues-box")
                  and QUEUE_OF_SHARD_1 not in queue_rows(browser)), 10, message=f"shard 0's queues first, without "
                                                                          f"{QUEUE_OF_SHARD_1}")
    Select(browser.find_element(By.ID, "queue-shard")).select_by_value("1")
    wait_for(seen(lambda: queue_rows(browser).get(QUEUE_OF_SHARD_1) == str(MESSAGES)), 10,
             message=f"{QUEUE_OF_SHARD_1} at depth {MESSAGES} in shard 1's table")
    screenshot("sharded-queues")
    click(browser, By.LINK_TEXT, QUEUE_OF_SHARD_1)
    wait_for(seen(lambda: text(browser, "queue-depth") == str(MESSAGES)), 10, message="the queue's page")
    wait_for(seen(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#peek tbody tr")) == MESSAGES), 10,
             message="its messages peeked at its owner")
    assert text(browser, "queue-where").startswith("on n2.s1 (its shard's primary)")
    screenshot("sharded-queue")
