"""Fixtures for the web console's tests: a cluster of real brokers, each serving its console on a free port,
and a real headless Chromium (Debian's `chromium` and `chromium-driver`, which `make setup` installs) driven by
Selenium. Selenium is given the browser and its driver, so it never looks for or downloads one of its own.

`console_cluster`  a started 3-broker HaCluster (b0 primary), users `ops` (admin, allowed everything) and `app`
                   (send and receive on orders.*), anonymous clients refused, audit events in a directory per
                   broker named after it in `audit_dir`;
                   `console_setup.console_url(broker)` a broker's console.
`browser`          a headless Chromium for the module; `screenshot(name)` saves the page into the module's
                   temporary output directory (not the repository); `page_errors` fails a test whose page's
                   script logged an error.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Iterator

import pytest
from selenium.common.exceptions import WebDriverException

from console_setup import APP_PASSWORD
from ha_harness import HaCluster, unexpected_exits
from harness import free_port

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def console_cluster(tmp_path_factory) -> Iterator[HaCluster]:
    users = {"app": {"password": APP_PASSWORD, "allow": {"send": ["orders.*"], "receive": ["orders.*"]}}}
    audit = tmp_path_factory.mktemp("audit")
    c = HaCluster(tmp_path_factory.mktemp("cluster"), 3,
                  extra={"anonymous": False, "users": users, "audit": {"dir": str(audit)}})
    c.audit_dir = audit
    for b in c:
        b.config["http"] = {"listen": f"127.0.0.1:{free_port()}"}
        b.config["audit"] = {"dir": str(audit / b.name)}  # as `cluster up --audit-dir` lays them out
    try:
        c.start_cluster()
        yield c
    finally:
        crashed = unexpected_exits(c.brokers)
        c.shutdown()
        print(c.log_tails(60))
        assert not crashed, crashed


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[object]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            pytest.fail(f"{path} is missing: `make setup` installs Debian's chromium and chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def screenshot(browser, tmp_path_factory) -> Callable[[str], Path]:
    directory = tmp_path_factory.mktemp("screenshots")

    def save(name: str) -> Path:
        path = directory / f"{name}.png"
        browser.save_screenshot(str(path))
        print(f"screenshot: {path}")
        return path
    return save


@pytest.fixture
def page_errors(browser) -> Iterator[None]:
    """Any error the page's script logged fails the test (a network error while a broker is dead is expected)."""
    yield
    try:
        logs = browser.get_log("browser")
    except WebDriverException:
        return
    errors = [e["message"] for e in logs if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert not errors, errors
