"""What the console tests' fixtures (conftest.py) and tests share (a module of its own: `conftest` names another
directory's module in a run of several): the restricted user's password, where a broker's console is, and how a
test reads and works the page and the API."""
from __future__ import annotations

import http.client
import json

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from harness import wait_for

APP_PASSWORD = "app-secret"


def console_url(broker) -> str:
    return f"http://{broker.config['http']['listen']}/"


def seen(condition):
    """A condition on the page; the page redraws its tables every second, so an element read may go stale."""
    def check():
        try:
            return condition()
        except (StaleElementReferenceException, NoSuchElementException):
            return None
    return check


def queue_rows(browser) -> dict[str, str]:
    """The Queues page's table: each queue's depth as shown."""
    return {row.get_attribute("data-name"): row.find_element(By.CSS_SELECTOR, "td.depth").text
            for row in browser.find_elements(By.CSS_SELECTOR, "#queues-table tbody tr")}


def text(browser, element_id: str) -> str:
    return browser.find_element(By.ID, element_id).text


def click(browser, by: str, value: str) -> None:
    """Click an element of a table the page may redraw between finding it and clicking it."""
    def clicked():
        browser.find_element(by, value).click()
        return True
    wait_for(seen(clicked), 10, message=f"{value} clicked")


def submit_login(browser, user: str, password: str) -> None:
    wait_for(seen(lambda: browser.find_element(By.ID, "login-user").is_displayed()), 10, message="the login form")
    for field, value in (("login-user", user), ("login-password", password)):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()


def log_in(browser, user: str, password: str) -> None:
    submit_login(browser, user, password)
    wait_for(seen(lambda: text(browser, "user") == f"logged in as {user}"), 10, message=f"logged in as {user}")


def nav(browser, page: str) -> None:
    click(browser, By.CSS_SELECTOR, f'nav a[data-page="{page}"]')


def http_json(address: str, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """A request to the API at HOST:PORT: the status and the JSON answered."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body, headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data.startswith(b"{") else {"raw": data.decode(errors="replace")}
    finally:
        conn.close()
