"""haqueue.broker.access and haqueue.passwords: glob semantics, logins, the relay's remembered answers."""
from __future__ import annotations

import pytest

from haqueue import passwords
from haqueue.broker import access as access_module
from haqueue.broker.access import ADMIN, MANAGE, RECEIVE, SEE, SEND, Access
from haqueue.broker.errors import UNAUTHORIZED, BrokerError
from haqueue.config import AllowConfig, UserConfig, allow_everything


def make(anonymous: AllowConfig | None = None, **allow: AllowConfig) -> Access:
    return Access({name: UserConfig(a, password="pw") for name, a in allow.items()}, anonymous)


@pytest.mark.parametrize("address, allowed", [
    ("orders.eu", True), ("orders.eu.north", True), ("orders.", True),  # `*` matches dots too, as auto_create
    ("orders", False), ("Orders.eu", False), ("x.orders.eu", False), ("q1", True), ("q12", False),
])
def test_globs_match_whole_addresses(address, allowed):
    a = make(app=AllowConfig(send=["orders.*", "q?"]))
    assert a.may("app", SEND, address) is allowed
    assert not a.may("app", RECEIVE, address)


def test_see_is_any_permission_on_the_name_or_admin():
    a = make(app=AllowConfig(receive=["r"], manage=["m"]), ops=AllowConfig(admin=True))
    assert [a.may("app", SEE, x) for x in ("r", "m", "other")] == [True, True, False]
    assert a.may("ops", SEE, "other") and a.may("ops", ADMIN, "READ broker")
    assert not a.may("app", ADMIN, "READ broker")


def test_unknown_users_and_refused_anonymous_may_nothing():
    a = make(None, app=allow_everything())
    assert not a.anonymous and not a.may("anonymous", RECEIVE, "q") and not a.may("nobody", SEND, "q")
    assert not a.authenticate("ANONYMOUS", "anonymous", "")
    b = make(AllowConfig(receive=["public.*"]))
    assert b.anonymous and b.authenticate("ANONYMOUS", "anonymous", "")
    assert b.may("anonymous", RECEIVE, "public.news") and not b.may("anonymous", MANAGE, "public.news")


def test_check_names_user_action_and_address():
    a = make(app=AllowConfig())
    with pytest.raises(BrokerError) as e:
        a.check("app", SEND, "payments")
    assert (e.value.condition, e.value.description, e.value.status) == \
        (UNAUTHORIZED, "user 'app' may not send to 'payments'", 403)


def test_hashed_password_is_checked_once_while_it_stays_right(monkeypatch):
    hashed = passwords.make_hash("right")
    a = Access({"app": UserConfig(AllowConfig(), password_hash=hashed)}, None)
    calls = []
    real = access_module.verify
    monkeypatch.setattr(access_module, "verify", lambda stored, pw: calls.append(pw) or real(stored, pw))
    assert a.authenticate("PLAIN", "app", "right") and a.authenticate("PLAIN", "app", "right")
    assert not a.authenticate("PLAIN", "app", "wrong") and not a.authenticate("PLAIN", "app", "wrong")
    assert calls == ["right", "wrong", "wrong"]  # a wrong password always pays the full check


def test_bad_hashes_are_named():
    with pytest.raises(passwords.BadHash, match="not a hash made by `haqueue passwd`"):
        passwords.check_hash("$2b$12$bcrypt")
    with pytest.raises(passwords.BadHash, match="not base64"):
        passwords.check_hash("$scrypt$ln=14,r=8,p=1$a$b")


def test_relay_decides_each_address_once(caplog):
    a = make(app=AllowConfig(send=["orders.*"]), ops=allow_everything())
    assert a.relay("ops") is None  # may send anywhere: no check at all
    check = a.relay("app")
    assert check is not None
    check("orders.eu")
    for _ in range(3):
        with pytest.raises(BrokerError, match="user 'app' may not send to 'payments'"):
            check("payments")
    assert [r.getMessage() for r in caplog.records] == ["refused: user 'app' may not send to 'payments'"]
