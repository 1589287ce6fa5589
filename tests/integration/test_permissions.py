"""Per-user permissions (design/permissions.md): users × actions × addresses, each with the outcome a
client sees, through proton clients (links and `$management` requests) and `haqueue admin`."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time

import pytest
from proton import Delivery, Message
from proton.reactor import Copy
from proton.utils import LinkDetached

from clients import Client
from harness import BrokerProcess, run_haqueue, wait_for

pytestmark = pytest.mark.timeout(120)

UNAUTHORIZED = "amqp:unauthorized-access"
PASSWORDS = {"ops": "ops-secret-1", "app": "app-secret-2", "legacy": "legacy-secret-3", "reader": "reader-secret-4"}
ALL = {"send": ["*"], "receive": ["*"], "manage": ["*"], "admin": True}
COSTLY_N = 1 << 17


def passwd(password: str) -> str:
    """A password hash as `haqueue passwd` prints it (the password on stdin)."""
    p = run_haqueue(["passwd"], input=password + "\n")
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def costly_hash(password: str) -> str:
    """A hash as `haqueue passwd` writes them, but 8 times as costly to check (scrypt N = 2**17, 128 MiB)."""
    salt = os.urandom(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=COSTLY_N, r=8, p=1, maxmem=256 << 20, dklen=32)
    return f"$scrypt$ln=17,r=8,p=1${base64.b64encode(salt).decode().rstrip('=')}${base64.b64encode(key).decode().rstrip('=')}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    config = {
        "anonymous": {"allow": {"receive": ["public.*"]}},
        "users": {
            "ops": {"password": PASSWORDS["ops"], "allow": ALL},
            "app": {"password": PASSWORDS["app"], "allow": {"send": ["orders.*"], "receive": ["orders.*"]}},
            "legacy": PASSWORDS["legacy"],  # a plain password, as before permissions: allowed everything
            "reader": {"password_hash": passwd(PASSWORDS["reader"]),
                       "allow": {"receive": ["orders.*", "events"], "manage": ["orders.*"]}},
            "costly": {"password_hash": costly_hash("costly-secret-7"), "allow": {}},
        },
        "queues": [{"name": "orders.eu"}, {"name": "payments"}, {"name": "public.news"}],
        "exchanges": [{"name": "events", "type": "topic"}, {"name": "audit", "type": "fanout"}],
        "bindings": [{"exchange": "events", "queue": "orders.eu", "key": "order.#"},
                     {"exchange": "audit", "queue": "payments"}],
    }
    b = BrokerProcess(tmp_path_factory.mktemp("permissions"), config, name="perm", port_retries=3)
    b.start()
    yield b
    b.stop()
    print(b.log())


def connect(broker, user: str) -> Client:
    if user == "anonymous":
        return Client(broker, sasl_enabled=False)
    return Client(broker, user=user, password=PASSWORDS[user], allowed_mechs="PLAIN")


def admin(broker, user: str, *args: str):
    auth = [] if user == "anonymous" else ["--user", user, "--password", PASSWORDS[user]]
    return run_haqueue(["admin", "-b", broker.address, *auth, *args])


def refused(user: str, verb: str, address: str) -> str:
    return f"user '{user}' may not {verb} '{address}'"


def logged(broker, description: str) -> None:
    wait_for(lambda: f"WARNING haqueue.access: refused: {description}" in broker.log(), 5,
             message=f"the refusal logged: {description}")


# ---- links: decided at attach ----------------------------------------------------------------

VERBS = {"send": "send to", "receive": "receive from", "browse": "receive from", "subscribe": "receive from",
         "relay": "send to"}

# (user, action, address, allowed). `subscribe` consumes from an exchange; `relay` sends through the
# anonymous relay (no link address) a message whose `to` is the address.
LINKS = [
    ("ops", "send", "payments", True),
    ("ops", "receive", "payments", True),
    ("ops", "relay", "payments", True),
    ("app", "send", "orders.eu", True),
    ("app", "send", "orders.new", True),  # auto-created: sending there is enough
    ("app", "send", "payments", False),
    ("app", "send", "events", False),
    ("app", "receive", "orders.eu", True),
    ("app", "receive", "payments", False),
    ("app", "browse", "orders.eu", True),
    ("app", "browse", "payments", False),
    ("app", "subscribe", "events", False),
    ("app", "relay", "orders.eu", True),
    ("app", "relay", "payments", False),
    ("legacy", "send", "payments", True),
    ("legacy", "receive", "payments", True),
    ("legacy", "relay", "payments", True),
    ("reader", "send", "orders.eu", False),
    ("reader", "receive", "orders.eu", True),
    ("reader", "browse", "orders.eu", True),
    ("reader", "subscribe", "events", True),
    ("reader", "receive", "payments", False),
    ("anonymous", "receive", "public.news", True),
    ("anonymous", "browse", "public.news", True),
    ("anonymous", "receive", "orders.eu", False),
    ("anonymous", "send", "public.news", False),
    ("anonymous", "relay", "public.news", False),
]


def attempt(c: Client, action: str, address: str) -> tuple[str, str] | None:
    """Do `action`; None if it was allowed, else the refusal's (condition, description)."""
    try:
        if action == "send":
            c.send(address, ["m"])
        elif action in ("receive", "subscribe"):
            c.receiver(address, credit=1).close()
        elif action == "browse":
            c.receiver(address, credit=1, options=Copy()).close()
        elif action == "relay":
            d = c.send_one(None, Message(address=address, body="m"))
            if d.remote_state != Delivery.ACCEPTED:
                return d.remote.condition.name, d.remote.condition.description
    except LinkDetached as e:
        return e.link.remote_condition.name, e.link.remote_condition.description
    return None


@pytest.mark.parametrize("user, action, address, allowed", LINKS,
                         ids=[f"{u}-{a}-{addr}" for u, a, addr, _ in LINKS])
def test_links(broker, user, action, address, allowed):
    with connect(broker, user) as c:
        outcome = attempt(c, action, address)
        description = refused(user, VERBS[action], address)
        assert outcome == (None if allowed else (UNAUTHORIZED, description))
        if not allowed:
            logged(broker, description)
        if action == "relay" and user == "app":  # the relay link stays usable for what the user may send to
            assert attempt(c, "relay", "orders.eu") is None


def test_refused_attach_creates_nothing(broker):
    with connect(broker, "app") as c:
        assert attempt(c, "send", "secret.new") == (UNAUTHORIZED, refused("app", "send to", "secret.new"))
    with connect(broker, "ops") as c:
        assert "secret.new" not in [q["name"] for q in c.mgmt("QUERY", "queue").body]


@pytest.mark.parametrize("user", ["app", "reader", "anonymous"])
def test_a_dynamic_queue_is_anyones_own(broker, user):
    with connect(broker, user) as c:
        reply = c.receiver(None, dynamic=True, credit=1)
        assert reply.address.startswith("amq.tmp.")


# ---- $management: decided per request ----------------------------------------------------------

# (user, operation, type, name, body, refusal: (verb, address) or None). Names are unique per row:
# the broker is shared by the module.
MANAGEMENT = [
    ("ops", "CREATE", "queue", "m.ops", {}, None),
    ("ops", "READ", "broker", None, None, None),
    ("legacy", "CREATE", "queue", "m.legacy", {}, None),
    ("legacy", "READ", "broker", None, None, None),
    ("app", "CREATE", "queue", "orders.m1", {}, ("manage", "orders.m1")),
    ("app", "DELETE", "queue", "orders.eu", None, ("manage", "orders.eu")),
    ("app", "DELETE", "exchange", "events", None, ("manage", "events")),
    ("app", "READ", "queue", "orders.eu", None, None),
    ("app", "READ", "queue", "payments", None, ("see", "payments")),
    ("app", "READ", "broker", None, None, ("run admin operations", "READ broker")),
    ("app", "READ", "store", None, None, ("run admin operations", "READ store")),
    ("reader", "CREATE", "queue", "orders.m2", {}, None),
    ("reader", "DELETE", "queue", "orders.m2", None, None),
    ("reader", "CREATE", "queue", "payments.m3", {}, ("manage", "payments.m3")),
    ("reader", "CREATE", "queue", "orders.m4", {"dead_letter_address": "payments"}, ("send to", "payments")),
    ("reader", "CREATE", "exchange", "orders.x", {"type": "fanout"}, None),
    ("reader", "CREATE", "binding", None, {"exchange": "events", "queue": "orders.eu", "key": "m5"}, None),
    ("reader", "DELETE", "binding", None, {"exchange": "events", "queue": "orders.eu", "key": "m5"}, None),
    ("reader", "CREATE", "binding", None, {"exchange": "audit", "queue": "orders.eu"}, ("receive from", "audit")),
    ("app", "CREATE", "binding", None, {"exchange": "events", "queue": "orders.eu", "key": "m6"},
     ("manage", "orders.eu")),
    ("anonymous", "CREATE", "queue", "public.m7", {}, ("manage", "public.m7")),
    ("anonymous", "READ", "queue", "public.news", None, None),
    ("anonymous", "READ", "broker", None, None, ("run admin operations", "READ broker")),
]


def _expected(user: str, refusal: tuple[str, str] | None) -> str | None:
    if refusal is None:
        return None
    verb, address = refusal
    return f"user '{user}' may not run admin operations ({address})" if verb.startswith("run") \
        else refused(user, verb, address)


@pytest.mark.parametrize("user, operation, type_, name, body, refusal", MANAGEMENT,
                         ids=[f"{r[0]}-{r[1]}-{r[2]}-{r[3] or (r[4] or {}).get('exchange')}" for r in MANAGEMENT])
def test_management_requests(broker, user, operation, type_, name, body, refusal):
    with connect(broker, user) as c:
        reply = c.mgmt(operation, type_, name, body, expect=None)
    description = _expected(user, refusal)
    if description is None:
        assert reply.status < 400, (reply.status, reply.description)
    else:
        assert (reply.status, reply.description) == (403, description)
        logged(broker, description)


@pytest.mark.parametrize("user, queues, exchanges, bindings", [
    ("ops", {"orders.eu", "payments", "public.news"}, {"events", "audit"}, {("events", "orders.eu"),
                                                                             ("audit", "payments")}),
    ("legacy", {"orders.eu", "payments", "public.news"}, {"events", "audit"}, {("events", "orders.eu"),
                                                                                ("audit", "payments")}),
    ("app", {"orders.eu"}, set(), {("events", "orders.eu")}),
    ("reader", {"orders.eu"}, {"events"}, {("events", "orders.eu")}),
    ("anonymous", {"public.news"}, set(), set()),
])
def test_lists_show_what_a_user_may_touch(broker, user, queues, exchanges, bindings):
    """QUERY lists the objects a user may send to, receive from or manage (an admin: all of them)."""
    fixed = {"orders.eu", "payments", "public.news", "events", "audit"}
    with connect(broker, user) as c:
        assert {q["name"] for q in c.mgmt("QUERY", "queue").body} & fixed == queues
        assert {x["name"] for x in c.mgmt("QUERY", "exchange").body} & fixed == exchanges
        found = {(b["exchange"], b["queue"]) for b in c.mgmt("QUERY", "binding").body}
        assert {b for b in found if b[1] in fixed and b[0] in fixed} == bindings


def test_management_answers_only_go_where_the_user_may_send(broker):
    """A request's reply-to must be a temporary queue or an address the caller may send to: else a request
    could drop answers into any queue."""
    with connect(broker, "ops") as c:
        before = c.mgmt("READ", "queue", "payments").body["depth"]
    with connect(broker, "app") as c:
        d = c.send_one("$management", Message(id="x", reply_to="payments",
                                              properties={"operation": "READ", "type": "queue", "name": "orders.eu"}))
        assert d.remote_state == Delivery.REJECTED
        assert (d.remote.condition.name, d.remote.condition.description) == \
            (UNAUTHORIZED, refused("app", "send to", "payments"))
    with connect(broker, "ops") as c:
        assert c.mgmt("READ", "queue", "payments").body["depth"] == before


# ---- haqueue admin ------------------------------------------------------------------------------

# (user, command, refusal: (verb, address) or None)
CLI = [
    ("ops", ["queue", "add", "c.ops"], None),
    ("ops", ["queue", "del", "c.ops"], None),
    ("ops", ["status"], None),
    ("ops", ["store", "status"], None),
    ("legacy", ["exchange", "add", "c.legacy", "--type", "direct"], None),
    ("legacy", ["status"], None),
    ("app", ["queue", "add", "orders.c1"], ("manage", "orders.c1")),
    ("app", ["queue", "del", "payments"], ("manage", "payments")),
    ("app", ["exchange", "del", "events"], ("manage", "events")),
    ("app", ["bind", "events", "orders.eu", "--key", "c2"], ("manage", "orders.eu")),
    ("app", ["status"], ("run admin operations", "READ broker")),
    ("app", ["store", "status"], ("run admin operations", "READ store")),
    ("reader", ["queue", "add", "orders.c3"], None),
    ("reader", ["bind", "events", "orders.c3", "--key", "c3"], None),
    ("reader", ["unbind", "events", "orders.c3", "--key", "c3"], None),
    ("reader", ["queue", "del", "orders.c3"], None),
    ("reader", ["bind", "audit", "orders.eu"], ("receive from", "audit")),
    ("reader", ["exchange", "add", "c.reader", "--type", "topic"], ("manage", "c.reader")),
    ("anonymous", ["queue", "del", "public.news"], ("manage", "public.news")),
    ("anonymous", ["status"], ("run admin operations", "READ broker")),
]


@pytest.mark.parametrize("user, command, refusal", CLI, ids=[f"{u}-{'-'.join(c[:2])}" for u, c, _ in CLI])
def test_admin_cli(broker, user, command, refusal):
    p = admin(broker, user, *command)
    description = _expected(user, refusal)
    if description is None:
        assert p.returncode == 0, p.stderr
    else:
        assert (p.returncode, p.stderr.strip().splitlines()[-1]) == (1, f"haqueue: {description}")


def test_admin_cli_lists_what_a_user_may_see(broker):
    p = admin(broker, "app", "queue", "list")
    assert p.returncode == 0, p.stderr
    assert {json.loads(line)["name"] for line in p.stdout.splitlines()} & {"orders.eu", "payments"} == {"orders.eu"}


# ---- logging in ---------------------------------------------------------------------------------

def test_hashed_password_logs_in_and_a_wrong_one_does_not(broker):
    with connect(broker, "reader") as c:
        assert c.mgmt("READ", "queue", "orders.eu").status == 200
    with connect(broker, "reader") as c:  # again: the accepted password is remembered
        assert c.mgmt("READ", "queue", "orders.eu").status == 200
    with pytest.raises(Exception):
        Client(broker, user="reader", password="not-the-password-5", allowed_mechs="PLAIN", timeout=5)


def test_wrong_passwords_against_a_costly_hash_never_hold_up_other_clients(broker):
    """Checking `costly`'s hash takes one scrypt of 128 MiB. Three wrong logins at once are checked one
    after the other, away from the loop: a client already connected gets its answers all along."""
    started = time.monotonic()
    hashlib.scrypt(b"x", salt=b"s" * 16, n=COSTLY_N, r=8, p=1, maxmem=256 << 20, dklen=32)
    one_check = time.monotonic() - started
    refused = []

    def wrong_login() -> None:
        try:
            Client(broker, user="costly", password="not-it-8", allowed_mechs="PLAIN", timeout=30).close()
        except Exception as e:  # the refusal
            refused.append(e)

    with connect(broker, "ops") as c:
        c.roundtrip()
        logins = [threading.Thread(target=wrong_login) for _ in range(3)]
        for t in logins:
            t.start()
        waits = []
        while any(t.is_alive() for t in logins):
            started = time.monotonic()
            c.roundtrip()
            waits.append(time.monotonic() - started)
        for t in logins:
            t.join()
    assert len(refused) == 3
    assert len(waits) > 3 and max(waits) < one_check / 2, (waits, one_check)
    Client(broker, user="costly", password="costly-secret-7", allowed_mechs="PLAIN").close()  # the right one logs in


def test_a_client_retrying_a_wrong_password_is_logged_once(broker):
    """Five attempts in a row from one host: one warning (the next, a minute on, would count the rest)."""
    for _ in range(5):
        with pytest.raises(Exception):
            Client(broker, user="legacy", password="wrong-again-9", allowed_mechs="PLAIN", timeout=5)
    assert broker.log().count("refused: wrong user name or password for 'legacy'") == 1


def test_passwords_are_never_logged(broker):
    with pytest.raises(Exception):
        Client(broker, user="app", password="wrong-password-6", allowed_mechs="PLAIN", timeout=5)
    wait_for(lambda: "wrong user name or password for 'app'" in broker.log(), 5, message="the failed login logged")
    log = broker.log()
    for secret in [*PASSWORDS.values(), "wrong-password-6", "not-the-password-5", "wrong-again-9"]:
        assert secret not in log


def test_passwd_reads_stdin_never_an_argument():
    hashed = passwd("s3cret")
    assert hashed.startswith("$scrypt$ln=14,r=8,p=1$") and "s3cret" not in hashed
    assert passwd("s3cret") != hashed  # salted
    p = run_haqueue(["passwd", "s3cret"])
    assert p.returncode == 2 and "unrecognized arguments" in p.stderr
    p = run_haqueue(["passwd"], input="\n")
    assert (p.returncode, p.stderr.strip().splitlines()[-1]) == (2, "haqueue: passwd: the password is empty")

