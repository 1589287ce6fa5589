"""The web console of a 3-broker cluster in a real browser (headless Chromium), as an operator uses it: log in,
see the brokers and a queue filling; declare and delete a queue and an exchange, a refused declaration, close a
client's connection; a delete and a purge from a queue's page opened on a backup's console, made at the primary;
the page following a failover without a reload, its header and tables never disagreeing; a restricted user's
narrower view and refused purge, the refusal kept on the page until the next navigation; the HA peer user
refused; what bad HTTP requests are answered, and the overview's and queue table's fields; a promotion refused as
the CLI refuses it, and one made from the page. Each action is checked in the page and in the broker's own state.

The tests share one cluster and one browser and build on each other, in order (a module runs on one worker).
"""
from __future__ import annotations

import json
import re
import socket
import time

import pytest
from proton import Message
from proton.utils import ConnectionClosed
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from haqueue import __version__
from haqueue.console.sessions import Sessions

from console_setup import APP_PASSWORD, click, console_url, http_json, log_in, nav, queue_rows, seen, submit_login, text
from ha_harness import HA_USER, OPS_USER, connect
from harness import wait_for

pytestmark = pytest.mark.usefixtures("page_errors")

QUEUE = "orders.q"
MESSAGES = 100
FAILOVER_SECONDS = 10  # the page shows the new primary within this long of the kill, without a reload


def _brokers(browser) -> dict[str, dict[str, str]]:
    return {row.get_attribute("data-name"): {"role": row.get_attribute("data-role"),
                                             "state": row.get_attribute("data-state"),
                                             "ready": row.get_attribute("data-ready"),
                                             "release": row.get_attribute("data-release")}
            for row in browser.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")}


OVERVIEW = {"broker", "admin", "user", "primary", "public", "brokers", "shards", "age", "totals", "rates", "mirror"}
PRIMARY_ROW = {"name", "address", "role", "state", "epoch", "release", "protocols", "console", "connections", "queues",
               "sync", "min_confirmations", "holders", "confirming"}
TOTALS = {"queues", "queues_left_out", "messages", "bytes", "connections", "memory_used", "memory_alarm"}
QUEUES = {"total", "offset", "limit", "taken", "broker", "shard", "shards", "items"}
QUEUE_ROW = {"name", "depth", "bytes", "consumers", "rate_in", "rate_out", "replicate", "max_depth", "max_bytes",
             "overflow", "args"}


def _login(address: str, user: str, password: str) -> tuple[int, dict]:
    return http_json(address, "POST", "/api/login", json.dumps({"user": user, "password": password}).encode(),
                     {"Content-Type": "application/json"})


def _open(browser, url: str) -> None:
    """The page loaded afresh at `url`, as from a bookmark (one differing from the page open in its fragment alone
    is not loaded again by a get: reloaded then)."""
    same_page = browser.current_url.split("#")[0] == url.split("#")[0]
    browser.get(url)
    if same_page:
        browser.refresh()


def _accept_confirm(browser) -> None:
    def accepted():
        try:
            browser.switch_to.alert.accept()
            return True
        except NoAlertPresentException:
            return False
    wait_for(accepted, 15, message="the confirmation dialog")  # a busy machine's browser: 5 s fell short once


def _publish(cluster, n: int) -> None:
    conn = connect(cluster.public, user=OPS_USER, password=cluster.password)
    try:
        sender = conn.create_sender(QUEUE)
        for i in range(n):
            sender.send(Message(body=f"order {i}", durable=True, properties={"n": i}))
    finally:
        conn.close()


def test_admin_sees_three_brokers_and_a_queue_filling(console_cluster, browser, screenshot):
    c = console_cluster
    browser.get(console_url(c[1]))  # a backup's console: the page moves to the primary's by itself
    log_in(browser, OPS_USER, c.password)
    brokers = wait_for(seen(lambda: (lambda b: b if len(b) == 3 and [n for n, x in b.items() if x["role"] == "primary"]
                                      == ["b0"] and sum(x["ready"] == "true" for x in b.values()) == 2 else None)(
        _brokers(browser))), 10, message="three brokers: b0 primary, two ready backups")
    assert {n: x["role"] for n, x in brokers.items()} == {"b0": "primary", "b1": "backup", "b2": "backup"}
    assert {x["release"] for x in brokers.values()} == {__version__}
    wait_for(seen(lambda: "b0 (primary" in text(browser, "talking-to")), 10, message="talking to the primary")
    span = wait_for(lambda: browser.execute_script("const c = state.charts.overview; "
                                                   "return c ? c.scales.x.max - c.scales.x.min : null"), 10,
                    message="the rates chart")
    assert span == pytest.approx(60), f"the rates chart spans {span} s"  # its points' few seconds: the last minute
    screenshot("overview")

    nav(browser, "queues")
    _publish(c, MESSAGES)
    wait_for(seen(lambda: queue_rows(browser).get(QUEUE) == str(MESSAGES)), 10, message=f"{QUEUE} at depth 100")
    screenshot("queues")

    click(browser, By.LINK_TEXT, QUEUE)
    wait_for(seen(lambda: text(browser, "queue-depth") == str(MESSAGES)), 10, message="the queue's page at 100")
    wait_for(seen(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#peek tbody tr")) == 10), 10,
             message="the first 10 messages peeked")
    wait_for(seen(lambda: "order 0" in browser.find_element(By.CSS_SELECTOR, "#peek tbody tr").text), 10,
             message="the first message's body")  # read in a wait: the table is drawn anew every second
    screenshot("queue")
    c.wait_depth(c[0], QUEUE, MESSAGES)  # peeking took nothing

    for page, table in (("connections", "connections"), ("exchanges", "exchanges")):
        nav(browser, page)
        wait_for(seen(lambda: browser.find_element(By.ID, table).is_displayed()), 10, message=f"the {page} page")
        screenshot(page)


def _declare(browser, form: dict[str, str], button: str) -> None:
    for field, value in form.items():
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    click(browser, By.CSS_SELECTOR, button)


def _notice(browser, part: str) -> None:
    try:
        wait_for(lambda: part in text(browser, "notice"), 10, message=f"the notice {part!r}")
    except AssertionError as e:
        raise AssertionError(f"{e}; it reads {text(browser, 'notice')!r}") from None


def test_declare_and_delete_a_queue_and_an_exchange_from_the_page(console_cluster, browser, screenshot):
    c = console_cluster
    nav(browser, "queues")
    _declare(browser, {"new-queue": "made.q", "new-queue-args": '{"max_depth": 7}'}, "#declare-queue button")
    wait_for(seen(lambda: queue_rows(browser).get("made.q") == "0"), 10, message="made.q in the table")
    assert c.queues(c[0])["made.q"]["args"]["max_depth"] == 7
    _declare(browser, {"new-queue": "bad.q", "new-queue-args": '{"max_depth": -1}'}, "#declare-queue button")
    _notice(browser, "declare bad.q: refused: queue 'bad.q': argument 'max_depth' must be >= 0 (0: no limit), got -1")
    screenshot("declare-refused")
    assert "bad.q" not in c.queues(c[0])
    _open(browser, console_url(c[2]) + "#/queue/made.q")  # a bookmark on a backup's console
    wait_for(seen(lambda: text(browser, "queue-depth") == "0"), 10, message="made.q's page")
    click(browser, By.ID, "delete-queue")
    _accept_confirm(browser)
    wait_for(seen(lambda: browser.current_url.endswith("#/queues") and "made.q" not in queue_rows(browser)), 10,
             message="back at the queues, made.q gone")
    _notice(browser, "delete made.q: done")  # the result on the page the delete led to
    assert "made.q" not in c.queues(c[0])

    nav(browser, "exchanges")
    Select(browser.find_element(By.ID, "new-exchange-type")).select_by_visible_text("topic")
    _declare(browser, {"new-exchange": "made.x"}, "#new-exchange ~ button")
    wait_for(seen(lambda: browser.find_element(By.CSS_SELECTOR, '#exchanges tr[data-name="made.x"]')), 10,
             message="made.x in the table")
    assert c.exchanges(c[0])["made.x"]["type"] == "topic"
    click(browser, By.CSS_SELECTOR, 'button[aria-label="delete exchange made.x"]')
    _accept_confirm(browser)
    wait_for(seen(lambda: not browser.find_elements(By.CSS_SELECTOR, '#exchanges tr[data-name="made.x"]')), 10,
             message="made.x gone from the page")
    assert "made.x" not in c.exchanges(c[0])


def test_a_connections_links_then_close_it_from_the_page(console_cluster, browser, screenshot):
    c = console_cluster
    conn = connect(c.public, user=OPS_USER, password=c.password, container_id="closed-from-the-console")
    try:
        conn.create_receiver("linked.q")
        nav(browser, "connections")
        name = wait_for(seen(lambda: next((r.get_attribute("data-name") for r in browser.find_elements(
            By.CSS_SELECTOR, "#connections tbody tr") if "closed-from-the-console" in r.text), None)), 10,
            message="the client's connection on the page")
        click(browser, By.CSS_SELECTOR, f'button[aria-label="links of {name}"]')
        wait_for(seen(lambda: [cells.text for cells in browser.find_elements(
            By.CSS_SELECTOR, f'#connections tr[data-links-of="{name}"] tbody td')] == ["linked.q", "consumer"]), 10,
            message="its receiving link shown under it")
        screenshot("connections")
        click(browser, By.CSS_SELECTOR, f'button[aria-label="close connection from {name}"]')
        _accept_confirm(browser)
        with pytest.raises(ConnectionClosed, match="closed from the web console by ops"):
            conn.wait(lambda: False, timeout=10, msg="the console's close")
    finally:
        conn.close()
    wait_for(seen(lambda: not browser.find_elements(By.CSS_SELECTOR, f'#connections tr[data-name="{name}"]')), 10,
             message="the connection gone from the page")


# Keeps, each time the page changes, its header, the Overview's primary line and each broker's row (role and state).
RECORD_OVERVIEWS = """
window.overviews = [];
new MutationObserver(() => window.overviews.push({
  header: document.getElementById("talking-to").textContent,
  primary: (document.getElementById("primary") || {}).textContent,
  rows: Object.fromEntries(Array.from(document.querySelectorAll("#brokers tbody tr"),
                                      r => [r.dataset.name, `${r.dataset.role} ${r.dataset.state}`]))
})).observe(document.body, {subtree: true, childList: true, characterData: true});
"""


def _contradictions(overviews: list[dict]) -> list[dict]:
    """The pages shown whose header (`talking to NAME (ROLE, STATE)`) is not that broker's row, or names a primary
    the primary line does not."""
    wrong = []
    for shown in overviews:
        header = re.match(r"talking to (\S+) \((\w+), (\w+)\)", shown["header"])
        if header is None:
            continue
        name, role, state = header.groups()
        if shown["rows"].get(name) != f"{role} {state}" or \
                role == "primary" and not (shown["primary"] or "").startswith(f"primary: {name}"):
            wrong.append(shown)
    return wrong


def test_page_shows_the_new_primary_after_kill9_without_reload(console_cluster, browser, screenshot):
    c = console_cluster
    nav(browser, "overview")
    wait_for(seen(lambda: _brokers(browser).get("b0", {}).get("role") == "primary"), 10, message="b0 primary")
    browser.execute_script("window.notReloaded = true")
    browser.execute_script(RECORD_OVERVIEWS)
    killed = time.monotonic()
    c.kill(c[0])
    successor = c.best_backup(exclude=[c[0]])  # what `cluster up`'s supervisor promotes
    assert successor is not None
    c.promote(successor)
    wait_for(seen(lambda: _brokers(browser).get(successor.name, {}).get("role") == "primary"),
             FAILOVER_SECONDS - (time.monotonic() - killed), message=f"{successor.name} shown as the primary")
    assert browser.execute_script("return window.notReloaded") is True
    wait_for(seen(lambda: f"{successor.name} (primary" in text(browser, "talking-to")), 10,
             message="the page talking to the new primary")
    wait_for(seen(lambda: _brokers(browser).get("b0", {}).get("state") == "unreachable"), 10,
             message="b0 named, unreachable")  # by the page, if this console never read its name
    screenshot("overview-after-failover")
    overviews = browser.execute_script("return window.overviews")
    assert not _contradictions(overviews), _contradictions(overviews)


def test_purge_from_the_page_and_the_backup_follows(console_cluster, browser, screenshot):
    c = console_cluster
    primary = next(b for b in (c[1], c[2]) if c.try_status(b, 5)["role"] == "primary")
    backup = c[2] if primary is c[1] else c[1]
    c.wait_ready(backup, queues=[QUEUE])
    c.wait_depth(backup, QUEUE, MESSAGES)
    _open(browser, console_url(backup) + f"#/queue/{QUEUE}")  # the queue's page reloaded on a backup's console
    wait_for(seen(lambda: text(browser, "queue-depth") == str(MESSAGES)), 10, message="the queue's page")
    click(browser, By.ID, "purge")
    _accept_confirm(browser)
    wait_for(seen(lambda: text(browser, "queue-depth") == "0"), 10, message="depth 0 after the purge")
    # the purge's answer may come after a refresh's that shows depth 0
    wait_for(lambda: f"{MESSAGES} messages dropped" in text(browser, "notice"), 10, message="the purge's count")
    c.wait_depth(backup, QUEUE, 0)
    c.wait_depth(primary, QUEUE, 0)
    screenshot("queue-purged")


# Holds the page's next request whose URL has arguments[0] until `window.held()`, then sends it (without its 3 s
# timeout) and keeps its status in window.heldStatus.
HOLD_NEXT_REQUEST = """
const part = arguments[0], fetch0 = window.fetch;
window.held = null;
window.fetch = (url, options) => {
  if (!String(url).includes(part)) return fetch0(url, options);
  window.fetch = fetch0;
  return new Promise(resolve => { window.held = () => resolve(fetch0(url, {...options, signal: undefined})); });
};
"""


# Counts the page's reads (GETs) in window.reads.
COUNT_READS = """
const fetch1 = window.fetch;
window.reads = 0;
window.fetch = (url, options) => { if (!options || !options.method || options.method === "GET") window.reads++;
                                   return fetch1(url, options); };
"""


def test_restricted_user_sees_only_its_queues_and_is_refused_a_purge(console_cluster, browser, screenshot):
    c = console_cluster
    primary = next(b for b in (c[1], c[2]) if c.try_status(b, 5)["role"] == "primary")
    c.request(primary, "CREATE", "queue", "payments")
    _publish(c, 3)
    # A refresh of ops' queue page is under way at the logout and answered (401: logged out) after app's login: app
    # stays logged in (the page refreshes nothing else meanwhile, so app's queues below come after that answer).
    browser.execute_script(HOLD_NEXT_REQUEST, f"/api/queues/{QUEUE}")
    wait_for(lambda: browser.execute_script("return window.held !== null"), 5, message="a refresh held")
    browser.find_element(By.ID, "logout").click()
    # the HA peer user's password is in every broker's config: it is for brokers, not for people
    submit_login(browser, HA_USER, c.password)
    _notice(browser, f"log in as {HA_USER}: refused: '{HA_USER}' is the HA peer user (ha.username)")
    assert browser.find_element(By.ID, "login-user").is_displayed()
    assert any(f"refused a login as '{HA_USER}'" in b.log() for b in (c[1], c[2]))
    log_in(browser, "app", APP_PASSWORD)
    browser.execute_script("window.held()")
    browser.execute_script(COUNT_READS)
    nav(browser, "queues")
    wait_for(seen(lambda: queue_rows(browser) == {QUEUE: "3"}), 10, message=f"only {QUEUE}, no payments")

    # A queue it may not see, by a link: its page says so; a refused purge's result stays above it, whatever the
    # refreshes read meanwhile, until the next navigation
    browser.execute_script("location.hash = '#/queue/payments'")
    wait_for(seen(lambda: text(browser, "problem") == "user 'app' may not see 'payments'"), 10,
             message="the page's read refused")
    click(browser, By.ID, "purge")
    _accept_confirm(browser)
    refused = "purge payments: refused: user 'app' may not manage 'payments'"
    _notice(browser, refused)
    browser.execute_script("window.reads = 0")
    wait_for(lambda: browser.execute_script("return window.reads") >= 2, 10, message="a refresh after it")
    assert (text(browser, "notice"), text(browser, "problem")) == (refused, "user 'app' may not see 'payments'")
    screenshot("restricted-purge-refused")
    nav(browser, "overview")
    wait_for(seen(lambda: "Only an admin" in text(browser, "brokers-box")), 10, message="no cluster view for app")
    assert not browser.find_element(By.ID, "notice").is_displayed()  # the purge's result went with its page


def test_admin_sees_the_latest_audit_report(console_cluster, browser, screenshot):
    """A report `haqueue audit lag --out` wrote beside the brokers' audit directories (DIR/report, the brokers writing
    to DIR/NAME as `cluster up --audit-dir DIR` has them): its summary and lag.png on the Audit page."""
    c = console_cluster
    report = c.audit_dir / "report"
    report.mkdir()
    (report / "summary.txt").write_text("replication lag per queue and backup\nno confirmed message lost\n")
    (report / "lag.png").write_bytes(screenshot("audit-before").read_bytes())  # any PNG: the page shows it
    click(browser, By.ID, "logout")
    log_in(browser, OPS_USER, c.password)
    nav(browser, "audit")
    wait_for(seen(lambda: "no confirmed message lost" in text(browser, "audit-summary")), 10, message="the summary")
    wait_for(lambda: browser.execute_script("const i = document.querySelector('img.lag'); "
                                            "return i !== null && i.complete && i.naturalWidth > 0"), 10,
             message="lag.png shown")
    screenshot("audit")


def test_bad_http_requests_get_clear_answers_and_the_broker_serves_on(console_cluster):
    c = console_cluster
    address = next(b for b in (c[1], c[2]) if c.try_status(b, 5)["role"] == "primary").config["http"]["listen"]
    json_type = {"Content-Type": "application/json"}

    status, answer = _login(address, OPS_USER, "wrong")
    assert (status, answer["error"]) == (401, "wrong user name or password")
    status, answer = http_json(address, "GET", f"/api/queues/{QUEUE}")
    assert (status, answer["error"]) == (401, "log in first")

    status, login = _login(address, OPS_USER, c.password)
    assert status == 200
    cookie = {"Cookie": f"haqueue_session={login['token']}"}
    # a form another site makes the browser post: the cookie goes with it, the CSRF token cannot
    status, answer = http_json(address, "POST", f"/api/queues/{QUEUE}/purge", b"confirm=yes",
                           {**cookie, "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403 and "X-CSRF-Token" in answer["error"], answer
    # a huge body is refused from its Content-Length, before it is read
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(f"POST /api/queues HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
                  f"X-CSRF-Token: {login['csrf']}\r\nCookie: haqueue_session={login['token']}\r\n"
                  f"Content-Length: {1 << 30}\r\n\r\n{{".encode())
        answer_413 = s.makefile("rb").read().decode()
    assert answer_413.startswith("HTTP/1.1 413") and "at most 65536" in answer_413, answer_413
    status, answer = http_json(address, "POST", "/api/queues", b"{not json",
                           {**cookie, **json_type, "X-CSRF-Token": login["csrf"]})
    assert status == 400 and "not JSON" in answer["error"], answer
    for credentials in ({}, {"Authorization": "Bearer forged"}):  # a page of another site, with no valid token
        status, answer = http_json(address, "GET", "/api/overview", headers={"Origin": "https://elsewhere.example",
                                                                          **credentials})
        assert status == 403 and "may call this console only with a session token" in answer["error"], answer
    status, answer = http_json(address, "GET", "/api/overview", headers={"Origin": "https://elsewhere.example",
                                                                      "Authorization": f"Bearer {login['token']}"})
    assert status == 200, answer
    status, answer = http_json(address, "GET", "/api/nothing-here", headers=cookie)
    assert status == 404, answer
    status, answer = http_json(address, "GET", "/favicon.ico")
    assert status == 200 and answer["raw"].startswith("<svg"), (status, answer)
    status, answer = http_json(address, "GET", "/api/overview", headers={**cookie, "X-Big": "y" * 70000})
    assert status == 431 or status == 400, (status, answer)

    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400"), "a malformed request line"

    status, answer = http_json(address, "GET", f"/api/queues/{QUEUE}", headers=cookie)
    assert status == 200 and answer["name"] == QUEUE, answer  # still serving, and the broker too
    status, answer = http_json(address, "POST", f"/api/queues/{QUEUE}/purge", b"",
                           {**cookie, "X-CSRF-Token": login["csrf"]})
    assert status == 200 and answer["purged"] == 3, answer


def test_the_peer_user_gets_nothing_and_the_api_answers_as_documented(console_cluster):
    """The HA peer user is refused at the login (403), and a token signed for it (ha.password gives the key) as a
    bearer or a cookie (401), for a read and a change alike. The overview and the queue table answer the fields design/console.md
    lists; the broker's own count of queues is the table's and those it leaves out (a client's temporary queue)."""
    c = console_cluster
    address = next(b for b in (c[1], c[2]) if c.try_status(b, 5)["role"] == "primary").config["http"]["listen"]
    status, answer = _login(address, HA_USER, c.password)
    assert status == 403 and answer["error"].startswith(f"'{HA_USER}' is the HA peer user (ha.username)"), answer
    peer_refusal = (401, answer["error"])  # a token: as an expired one, so that the page asks for a login
    minter = Sessions(lambda user, password: True, False, c.password, lambda session_id: False)
    minted = minter.login(HA_USER, "")
    assert minted is not None
    for credentials in ({"Authorization": f"Bearer {minted.token}"}, {"Cookie": f"haqueue_session={minted.token}"}):
        status, answer = http_json(address, "GET", "/api/overview", headers=credentials)
        assert (status, answer.get("error")) == peer_refusal
        status, answer = http_json(address, "DELETE", "/api/connections/127.0.0.1:1",
                                   headers={**credentials, "X-CSRF-Token": minter.csrf(minted)})
        assert (status, answer.get("error")) == peer_refusal

    _, login = _login(address, OPS_USER, c.password)
    ops = {"Authorization": f"Bearer {login['token']}"}
    client = connect(c.public, user=OPS_USER, password=c.password)
    try:
        client.create_receiver(None, dynamic=True)  # a temporary queue: in the broker's count, not the table's

        def counted():
            overview = http_json(address, "GET", "/api/overview", headers=ops)[1]
            row = next(b for b in overview["brokers"] if b["name"] == overview["broker"]["name"])
            totals = overview["totals"]
            left_out = totals["queues_left_out"]
            return overview if left_out["temporary"] and row["queues"] == totals["queues"] + sum(left_out.values()) \
                else None
        overview = wait_for(counted, 10, message="the primary's count of queues: the table's and those left out")
    finally:
        client.close()
    assert set(overview) == OVERVIEW and overview["shards"] is None, overview
    assert set(next(b for b in overview["brokers"] if b["role"] == "primary")) == PRIMARY_ROW, overview
    assert set(overview["totals"]) == TOTALS, overview
    status, queues = http_json(address, "GET", "/api/queues?limit=1", headers=ops)
    assert set(queues) == QUEUES and set(queues["items"][0]) == QUEUE_ROW, queues
    _, login = _login(address, "app", APP_PASSWORD)
    status, overview = http_json(address, "GET", "/api/overview", headers={"Authorization": f"Bearer {login['token']}"})
    assert set(overview) == OVERVIEW and (overview["totals"], overview["rates"], overview["shards"]) == (None,) * 3
    assert {tuple(b) for b in overview["brokers"]} == {("name", "role", "console")}, overview


def test_a_logout_holds_at_every_broker_of_the_cluster(console_cluster):
    """Logged out at one broker's console, the token is refused by the others, and by the one that was down then
    once it is back."""
    c = console_cluster
    primary = next(b for b in (c[1], c[2]) if c.try_status(b, 5)["role"] == "primary")
    backup = c[2] if primary is c[1] else c[1]
    status, login = _login(backup.config["http"]["listen"], OPS_USER, c.password)
    assert status == 200, login
    bearer = {"Authorization": f"Bearer {login['token']}"}
    assert http_json(primary.config["http"]["listen"], "GET", "/api/overview", headers=bearer)[0] == 200
    status, answer = http_json(backup.config["http"]["listen"], "POST", "/api/logout", b"",
                           {**bearer, "X-CSRF-Token": login["csrf"]})
    assert (status, answer["untold"]) == (200, [c[0].address]), answer  # b0 was killed by the failover test
    for b in (primary, backup):
        status, answer = http_json(b.config["http"]["listen"], "GET", "/api/overview", headers=bearer)
        assert (status, answer["error"]) == (401, "the session has expired or was logged out; log in again")
    c.start(0)
    wait_for(lambda: http_json(c[0].config["http"]["listen"], "GET", "/api/overview", headers=bearer)[0] == 401, 20,
             message="b0, back, refusing the token")


def test_promote_from_the_page_refused_as_the_cli_is_then_a_ready_backup_promoted(console_cluster, browser,
                                                                                   screenshot):
    """The harness has no supervisor: with the primary killed, the page's Promote is what moves it. A ready
    backup beside a serving primary is refused (never two primaries); a backup restarted once the primary is
    killed cannot catch up: promoting it is refused too, in the page as by `admin ha promote`."""
    c = console_cluster
    primary = next(b for b in (c[1], c[2]) if c.try_status(b, 5)["role"] == "primary")
    c.wait_ready(c[0])  # restarted by the logout test
    nav(browser, "overview")
    wait_for(seen(lambda: _brokers(browser).get(c[0].name, {}).get("ready") == "true"), 10, message="b0 ready")
    click(browser, By.CSS_SELECTOR, 'button[aria-label="promote b0"]')
    _accept_confirm(browser)
    _notice(browser, f"promote b0: refused: b0 cannot be promoted: it follows {primary.name}, the primary of epoch")
    assert c.status(c[0])["role"] == "backup" and c.status(primary)["role"] == "primary"
    browser.execute_script("window.notReloaded = true")
    c.kill(primary)
    chosen = c.best_backup(exclude=[primary, c[0]])
    assert chosen is not None
    c.kill(c[0])
    c.start(0)
    wait_for(lambda: "is primary or a ready backup" in (c.try_status(c[0]) or {}).get("promotion_refused", ""), 15,
             message="b0 joining, its promotion refused")
    cli = c.cli(c[0], "ha", "promote")
    assert cli.returncode != 0 and "b0 cannot be promoted: still catching up" in cli.stderr, cli
    refusal = cli.stderr.strip().splitlines()[-1].split("b0 cannot be promoted", 1)[1]
    click(browser, By.CSS_SELECTOR, 'button[aria-label="promote b0"]')
    _accept_confirm(browser)
    _notice(browser, "promote b0: refused: b0 cannot be promoted" + refusal)
    screenshot("promote-refused")
    assert c.status(c[0])["role"] == "backup"

    click(browser, By.CSS_SELECTOR, f'button[aria-label="promote {chosen.name}"]')
    _accept_confirm(browser)
    _notice(browser, f"promote {chosen.name}: done")
    assert c.status(chosen)["role"] == "primary"
    wait_for(seen(lambda: _brokers(browser).get(chosen.name, {}).get("role") == "primary"), 10,
             message=f"{chosen.name} shown as the primary")
    assert browser.execute_script("return window.notReloaded") is True
    screenshot("overview-promoted")
