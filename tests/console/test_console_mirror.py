"""The Overview's Mirror section (design/console.md, design/mirroring.md) in a real browser: a source broker's console
shows its connection to the standby and each mirrored queue's lag; the standby's shows its mirror queues, their source
and their messages, and once promoted its mirror epoch; the source then shows why it is down (fenced) and the lag of
what it confirmed since. A console of a broker without a `mirror:` section has no such section. Each figure is checked
against `admin mirror status` or the clients' counts.
"""
from __future__ import annotations

import sys
from pathlib import Path

from proton import Message
from selenium.webdriver.common.by import By

from console_setup import console_url, seen
from ha_harness import send_all
from harness import free_port, run_haqueue, wait_for

from haqueue.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mirror"))
from mirror_harness import MIRROR_PASSWORD, MIRROR_USER, standby_config  # noqa: E402

QUEUE = "orders.0"


def row(browser, table: str, name: str) -> dict[str, str]:
    """A row of one of the section's tables: its cells' text by column, and its data- attributes."""
    found = browser.find_element(By.CSS_SELECTOR, f'#{table} tbody tr[data-name="{name}"]')
    headers = [h.text for h in browser.find_elements(By.CSS_SELECTOR, f"#{table} thead th")]
    cells = [c.text for c in found.find_elements(By.CSS_SELECTOR, "th, td")]
    return {**dict(zip(headers, cells)), "state": found.get_attribute("data-state") or ""}


def line(browser, element_id: str) -> tuple[str, dict[str, str]]:
    """A line of the section, read while the page redraws it: its text and data- attributes."""
    def read():
        found = browser.find_element(By.ID, element_id)
        return found.text, {k: found.get_attribute(f"data-{k}") or "" for k in ("connected", "role")}
    return wait_for(seen(read), 10, message=f"#{element_id}")


def overview(browser, broker) -> None:
    browser.get(console_url(broker))  # anonymous clients may do anything here: no login
    wait_for(seen(lambda: browser.find_element(By.ID, "totals").text != ""), 10, message="the overview drawn")


def test_the_mirror_section_on_a_source_and_its_standby(broker_factory, browser, screenshot, page_errors):
    standby = broker_factory(standby_config(http={"listen": f"127.0.0.1:{free_port()}"}), name="standby")
    source = broker_factory(name="source", http={"listen": f"127.0.0.1:{free_port()}"}, mirror={
        "cluster": "site-a", "to": [standby.address], "username": MIRROR_USER, "password": MIRROR_PASSWORD,
        "queues": ["orders.*"]})
    send_all(source.address, QUEUE, [Message(id=f"m{i}", body=i, durable=True) for i in range(10)])

    overview(browser, source)
    wait_for(seen(lambda: row(browser, "mirror-queues", QUEUE)["lag msgs"] == "0"
             and row(browser, "mirror-queues", QUEUE)["state"] == "mirroring"), 15, message="orders.0 mirrored, no lag")
    said, data = line(browser, "mirror-source")
    assert data["connected"] == "true" and standby.address in said, said
    assert not browser.find_elements(By.ID, "mirror-standby")  # a source only
    screenshot("mirror-source")

    overview(browser, standby)
    wait_for(seen(lambda: row(browser, "mirror-copies", QUEUE)["messages"] == "10"), 15,
             message="the standby's copy of orders.0 with its 10 messages")
    copy = wait_for(seen(lambda: row(browser, "mirror-copies", QUEUE)), 10, message="the copy's row")
    assert (copy["source"], copy["source connected"]) == ("site-a", "yes"), copy
    said, data = line(browser, "mirror-standby")
    assert data["role"] == "standby" and "site-a (connected)" in said, said
    assert not browser.find_elements(By.ID, "mirror-source")  # a standby only
    screenshot("mirror-standby")

    # the standby promoted (forced: its source is connected): the page shows the epoch, the source shows the fence
    promoted = run_haqueue(["admin", "-b", standby.address, "mirror", "promote", "--force"])
    assert promoted.returncode == 0, promoted.stderr
    wait_for(seen(lambda: line(browser, "mirror-standby")[1]["role"] == "promoted"), 10,
             message="the standby shown promoted")
    assert "promoted at mirror epoch 2" in line(browser, "mirror-standby")[0]
    send_all(source.address, QUEUE, [Message(id=f"late{i}", body=i, durable=True) for i in range(5)])
    overview(browser, source)
    said, data = wait_for(seen(lambda: (lambda shown: shown if "fenced" in shown[0] else None)(
        line(browser, "mirror-source"))), 15, message="the source saying it is fenced")
    assert data["connected"] == "false", said
    # the lag: what the source holds that the standby is not known to hold, as `admin mirror status` says it
    with AdminClient(source.address, 5.0) as admin:
        status = {q["queue"]: q for q in admin.request("READ", "mirror")[2]["source"]["queues"]}[QUEUE]
    assert status["lag_messages"] >= 5, status
    wait_for(seen(lambda: row(browser, "mirror-queues", QUEUE)["lag msgs"] == str(status["lag_messages"])), 15,
             message="the source's lag as its status says it")
    screenshot("mirror-fenced")

    plain = broker_factory(name="plain", http={"listen": f"127.0.0.1:{free_port()}"})
    overview(browser, plain)
    assert not browser.find_elements(By.ID, "mirror-title")
