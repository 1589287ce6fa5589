"""The console's logins and which pages may call it (haqueue/console/sessions.py, origins.py)."""
from __future__ import annotations

import pytest

from haqueue.console.logouts import Logouts
from haqueue.console.origins import Origins
from haqueue.console.sessions import PeerUser, Sessions

USERS = {"ops": "p1"}


def _sessions(secret: str | None = "cluster-password", anonymous: bool = False,
              logouts: Logouts | None = None) -> Sessions:
    return Sessions(lambda user, password: USERS.get(user) == password, anonymous, secret,
                    logouts.ended if logouts is not None else lambda session_id: False)


def test_a_login_is_good_at_every_broker_sharing_the_secret_until_logged_out(tmp_path):
    logouts = Logouts(str(tmp_path), [], None)  # a broker without peers: the logout is its own
    here, there, elsewhere = _sessions(logouts=logouts), _sessions(), _sessions("another cluster")
    assert here.login("ops", "wrong") is None and here.login("nobody", "p1") is None
    session = here.login("ops", "p1")
    assert session is not None and session.user == "ops"
    assert there.session(session.token) == session  # another broker of the cluster takes it
    assert elsewhere.session(session.token) is None
    assert here.csrf_ok(session, there.csrf(session)) and not here.csrf_ok(session, "forged")
    assert not here.csrf_ok(session, None)
    payload, _, signature = session.token.partition(".")
    assert here.session(payload[:-2] + "xx." + signature) is None  # tampered
    assert logouts.end(session.id, session.expires) == []
    assert here.session(session.token) is None and there.session(session.token) == session
    restarted = _sessions(logouts=Logouts(str(tmp_path), [], None))  # kept in the data directory
    assert restarted.session(session.token) is None


def test_the_peer_user_may_not_log_in_nor_use_a_token_signed_for_it():
    """Its password is in every broker's config file, and is the key the tokens are signed with."""
    anyone = lambda user, password: True  # noqa: E731 - every password right: the refusal is the user's
    sessions = Sessions(anyone, False, "cluster-password", lambda session_id: False, "ha")
    with pytest.raises(PeerUser, match="'ha' is the HA peer user"):
        sessions.login("ha", "cluster-password")
    minted = Sessions(anyone, False, "cluster-password", lambda session_id: False).login("ha", "")  # by a key holder
    assert minted is not None
    with pytest.raises(PeerUser):
        sessions.session(minted.token)
    ops = sessions.login("ops", "p1")
    assert ops is not None and sessions.session(ops.token) == ops


def test_anonymous_clients_need_no_login_where_the_config_lets_them_in():
    assert _sessions(anonymous=False).session(None) is None
    anonymous = _sessions(anonymous=True).session("not a token")
    assert anonymous is not None and anonymous.user == "anonymous" and anonymous.anonymous
    assert _sessions(anonymous=True).login("anonymous", "") is None


def test_pages_of_the_clusters_hosts_may_call_others_need_a_token():
    origins = Origins(["0.0.0.0", "127.0.0.1", "10.0.0.2"], ["https://console.example.com"])
    assert origins.allows("http://127.0.0.1:15673", "127.0.0.1:15672", with_token=False)
    assert origins.allows("http://localhost:15673", "127.0.0.1:15672", with_token=False)  # a loopback host's name
    assert origins.allows("http://10.0.0.2:15672", "10.0.0.1:15672", with_token=False)
    assert origins.allows("https://console.example.com", "10.0.0.1:15672", with_token=False)
    assert origins.allows("http://broker1:15672", "broker1:15672", with_token=False)  # its own, by any name
    assert not origins.allows("https://evil.example", "127.0.0.1:15672", with_token=False)
    assert origins.allows("https://evil.example", "127.0.0.1:15672", with_token=True)
