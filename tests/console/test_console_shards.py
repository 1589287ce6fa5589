"""The web console of a sharded cluster (`haqueue cluster up --shards --config FILE`, the file's users and
`anonymous: false`) in a real browser: every process serves one, printed as an unsharded cluster's are; the
overview's shard map shows each shard's primary and its backups' readiness; a queue of another shard is shown,
figures, messages and all, by its shard's primary's console, which the page follows from any other; a restricted
user sees only its queues."""
from __future__ import annotations

import json

import pytest
import yaml
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from haqueue.shard.ownership import shard_of_name

from console_setup import APP_PASSWORD, click, http_json, log_in, nav, queue_rows, seen, text
from ha_harness import OPS_USER, send_all, wait_for
from test_ha_supervisor import Supervised

pytestmark = pytest.mark.usefixtures("page_errors")

SHARDS = 2  # over 2 nodes (127.0.0.1, 127.0.0.2), 2 replicas each: shard i's preferred primary on node i + 1


def _of_shard_1(prefix: str) -> str:
    return next(name for name in (f"{prefix}-{i}" for i in range(100)) if shard_of_name(name, SHARDS) == 1)


QUEUE_OF_SHARD_1, PAYMENTS_OF_SHARD_1 = _of_shard_1("orders"), _of_shard_1("payments")
MESSAGES = 5
OPS_PASSWORD = "ops-secret"
USERS = {"anonymous": False, "users": {
    OPS_USER: {"password": OPS_PASSWORD, "allow": {"send": ["*"], "receive": ["*"], "manage": ["*"], "admin": True}},
    "app": {"password": APP_PASSWORD, "allow": {"send": ["orders-*"], "receive": ["orders-*"]}}}}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sharded")
    (directory / "users.yaml").write_text(yaml.safe_dump(USERS))
    s = Supervised(directory / "cluster", 2, args=("--shards", str(SHARDS), "--config", str(directory / "users.yaml")),
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
    browser.get(f"http://127.0.0.1:{sharded.console}/")  # n1.s0's
    log_in(browser, OPS_USER, OPS_PASSWORD)

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
    # at n1: relayed to shard 1's primary, which checks ops' permissions again
    send_all(nodes[0], QUEUE_OF_SHARD_1, list(range(MESSAGES)), user=OPS_USER, password=OPS_PASSWORD)
    console = f"127.0.0.1:{sharded.console}"
    status, login = http_json(console, "POST", "/api/login",
                              json.dumps({"user": OPS_USER, "password": OPS_PASSWORD}).encode(),
                              {"Content-Type": "application/json"})
    assert status == 200, login
    status, answer = http_json(console, "GET", f"/api/queues/{QUEUE_OF_SHARD_1}",
                               headers={"Authorization": f"Bearer {login['token']}"})
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


def _shard_1_queues(browser, wanted: dict[str, str], who: str) -> None:
    nav(browser, "queues")

    def chosen() -> bool:  # once the page has drawn the shards' choice
        Select(browser.find_element(By.ID, "queue-shard")).select_by_value("1")
        return True
    wait_for(seen(chosen), 10, message="shard 1 chosen")
    wait_for(seen(lambda: queue_rows(browser) == wanted), 10, message=f"shard 1's queues as {who} sees them: {wanted}")


def test_a_restricted_user_sees_only_its_queues(sharded, browser, screenshot):
    """app (the file's user allowed orders-* alone) sees no payments queue, which ops (an admin) sees."""
    nodes = next(line for line in sharded.seen if line.startswith("nodes ")).split()[1:]
    send_all(nodes[0], PAYMENTS_OF_SHARD_1, [0], user=OPS_USER, password=OPS_PASSWORD)
    _shard_1_queues(browser, {QUEUE_OF_SHARD_1: str(MESSAGES), PAYMENTS_OF_SHARD_1: "1"}, OPS_USER)
    click(browser, By.ID, "logout")
    log_in(browser, "app", APP_PASSWORD)
    _shard_1_queues(browser, {QUEUE_OF_SHARD_1: str(MESSAGES)}, "app")
    screenshot("sharded-queues-restricted")
