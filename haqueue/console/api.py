"""The console's JSON API (design/console.md), which its pages use and scripts may too.

Every read and action goes through the management node as the logged-in user (management_calls.py): the same
operations, permission checks (design/permissions.md) and refusals as `haqueue admin`. What only the console
has: the queue table (sorted, filtered and paged here from a copy of the queues, samples.py), the rates, and the
cluster's view (cluster_view.py). A change is refused on a backup, which would make it alone: the page sends it
to the primary's console.
"""
from __future__ import annotations

import base64
import fnmatch
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import unquote

from ..broker.access import ADMIN
from ..config import ShardConfig
from ..loop_calls import LoopUnresponsive, on_loop
from ..release import build_fields
from ..shard.forwarding_queues import FORWARD
from ..shard.ownership import shard_of_name
from .http_server import Reply, Request
from .logouts import Logouts
from .management_calls import Answer, ManagementCalls
from .messages import describe
from .origins import PREFLIGHT_HEADERS, Origins
from .samples import QueueRow, Samples
from .sessions import COOKIE, CSRF_HEADER, SESSION_SECONDS, PeerUser, Session, Sessions
from .static_files import StaticFiles

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha.ha_broker import HaBroker
    from .cluster_view import ClusterView

log = logging.getLogger("haqueue.console")

PAGE_DEFAULT, PAGE_MOST = 50, 500  # rows of a table answered by default, and at most
SORTS = ("name", "depth", "bytes", "consumers", "rate_in", "rate_out")
AUDIT_SUMMARY, AUDIT_CHART = "summary.txt", "lag.png"  # what `haqueue audit lag --out DIR` writes


class Refusal(Exception):
    """A request answered with an error status and a message naming the problem."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


@dataclass
class Call:
    request: Request
    session: Session
    match: re.Match[str]

    def name(self) -> str:
        return unquote(self.match.group("name"))

    def json(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            value = json.loads(self.request.body)
        except ValueError as e:
            raise Refusal(400, f"the body is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise Refusal(400, "the body must be a JSON object")
        return value

    def whole(self, key: str, default: int, most: int | None = None) -> int:
        text = self.request.query.get(key)
        if text is None:
            return default
        if not (text.isascii() and text.isdigit()):
            raise Refusal(400, f"'{key}' must be a whole number, got {text!r}")
        return min(int(text), most) if most is not None else int(text)


Handler = Callable[["ConsoleApi", Call], Reply]
PUBLIC, CHANGES = 1, 2  # a route's flags: answered without a login; changes something (CSRF token, primary only)


class ConsoleApi:
    def __init__(self, broker: "Broker", sessions: Sessions, logouts: Logouts, origins: Origins, ha: "HaBroker | None",
                 cluster: "ClusterView | None", audit_dir: str | None, shard: ShardConfig | None) -> None:
        self.broker = broker
        self.logouts = logouts
        self.shard = shard
        self.calls = ManagementCalls(broker)
        self.sessions = sessions
        self.origins = origins
        self.samples = Samples(broker)
        self.ha = ha
        self.cluster = cluster
        self.audit_dir = audit_dir
        self.url = ""  # set once the listener is bound (its port may be chosen then)
        self.static = StaticFiles()

    # -- dispatch ------------------------------------------------------------------------------------
    def __call__(self, request: Request) -> Reply:
        origin = request.headers.get("Origin")
        cors = Origins.headers(origin) if origin else []
        try:
            if request.method == "OPTIONS":  # a preflight: the request itself is checked when it comes
                return Reply(204, headers=cors + PREFLIGHT_HEADERS)
            reply = self._answer(request, origin)
        except Refusal as e:
            reply = _json(e.status, {"error": e.message, **e.extra})
        except LoopUnresponsive as e:
            reply = _json(503, {"error": str(e)})
        except Exception as e:  # noqa: BLE001 - a bug answers 500 naming it; the server goes on
            log.exception("console request %s %s failed", request.method, request.path)
            reply = _json(500, {"error": f"internal error: {e!r}"})
        reply.headers += cors
        return reply

    def _answer(self, request: Request, origin: str | None) -> Reply:
        if not request.path.startswith("/api/"):
            if request.method not in ("GET", "HEAD"):
                raise Refusal(405, f"{request.method} {request.path}: the pages are only read")
            return self.static.reply(request.path)
        bearer = _bearer(request)
        token = bearer or _cookie(request, COOKIE)
        try:
            session = self.sessions.session(token)
        except PeerUser as e:  # as an expired token is: the page asks for a login (of another user)
            log.warning("console: refused a session token of the HA peer user from %s (%s %s)", request.client,
                        request.method, request.path)
            raise Refusal(401, str(e), login=True) from None
        signed_in = bearer is not None and session is not None and session.token == bearer  # a valid one, not any
        if origin is not None and not self.origins.allows(origin, request.host, signed_in):
            raise Refusal(403, f"a page from {origin} may call this console only with a session token (log in); "
                               f"add it to http.allow_origins to let its pages in")
        for method, pattern, handler, flags in ROUTES:
            match = pattern.fullmatch(request.path)
            if match is None or method != request.method:
                continue
            if session is None and not flags & PUBLIC:
                raise Refusal(401, "log in first" if not token else "the session has expired or was logged out; "
                                                                    "log in again", login=True)
            if flags & CHANGES:
                self._check_change(request, session, match)
            return handler(self, Call(request, session or _NOBODY, match))
        if any(pattern.fullmatch(request.path) for _, pattern, _, _ in ROUTES):
            raise Refusal(405, f"{request.method} is not an operation of {request.path}")
        raise Refusal(404, f"no such API path: {request.path}")

    def _check_change(self, request: Request, session: Session | None, match: re.Match[str]) -> None:
        if session is not None and not self.sessions.csrf_ok(session, request.headers.get(CSRF_HEADER)):
            raise Refusal(403, f"missing or wrong {CSRF_HEADER} header: a change needs the session's CSRF token "
                               f"(GET /api/session gives it)")
        if request.body and request.headers.get_content_type() != "application/json":
            raise Refusal(415, "send the body as application/json")
        if self.ha is not None and self.ha.primary is None and match.re not in (PROMOTE, LOGOUT):
            raise Refusal(409, f"{self.broker.name} is a backup: a change made here would be made here alone; send it "
                               f"to the primary's console", backup=True)

    # -- sessions ------------------------------------------------------------------------------------
    def session(self, call: Call) -> Reply:
        s = call.session
        return _json(200, {"broker": self.broker.name, "console": self.url, "anonymous": self.sessions.anonymous_allowed,
                           "user": None if s is _NOBODY else s.user,
                           "token": s.token, "csrf": None if s is _NOBODY else self.sessions.csrf(s)})

    def login(self, call: Call) -> Reply:
        if call.request.headers.get_content_type() != "application/json":  # a form another site posts is not
            raise Refusal(415, "send the login as application/json: {\"user\": ..., \"password\": ...}")
        body = call.json()
        user, password = body.get("user"), body.get("password")
        if not isinstance(user, str) or not isinstance(password, str):
            raise Refusal(400, "a login needs \"user\" and \"password\" (strings)")
        try:
            session = self.sessions.login(user, password)
        except PeerUser as e:
            log.warning("console: refused a login as %r from %s: the HA peer user may not use the console", user,
                        call.request.client)
            raise Refusal(403, str(e)) from None
        if session is None:
            log.warning("console: wrong user name or password for %r", user)
            raise Refusal(401, "wrong user name or password", login=True)
        cookie = f"{COOKIE}={session.token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION_SECONDS}"
        return _json(200, {"user": session.user, "token": session.token, "csrf": self.sessions.csrf(session),
                           "expires": int(session.expires)},
                     [("Set-Cookie", cookie + ("; Secure" if self.url.startswith("https:") else ""))])

    def logout(self, call: Call) -> Reply:
        """Ended here and at every other broker of the cluster; `untold`: those that have not taken it yet (they are
        told again until they do)."""
        untold = self.logouts.end(call.session.id, call.session.expires) if call.session.token is not None else []
        return _json(200, {"user": None, "untold": untold},
                     [("Set-Cookie", f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")])

    # -- the overview ------------------------------------------------------------------------------------
    def overview(self, call: Call) -> Reply:
        """The cluster as one reading shows it: the serving broker's own line (the page's header) is its row of
        the same reading as the table, so that the two never disagree while a broker takes over."""
        user = call.session.user
        own = self._read(user, "READ", "broker", refusals=(403,))
        admin = own is not None
        if self.cluster is not None:
            view = self.cluster.view()
            here = next((b for b in view["brokers"] if b["role"] and b["address"] == self.cluster.own), None)
        else:
            view = self._alone(own)
            here = view["brokers"][0]
        if here is None:  # a broker whose address is not in ha.brokers: not in the reading
            here = on_loop(self.broker.engine.call_soon_threadsafe, self.broker.status, 5.0)
        answer: dict[str, Any] = {
            "broker": {"name": here["name"], "role": here["role"], "state": here["state"], "console": self.url,
                       **({"shard": self.shard.index} if self.shard is not None else {})},
            "admin": admin, "user": user, "primary": view["primary"], "public": view["public"],
            # a user who is not an admin gets which broker is which, to reach the primary and another when one dies
            "brokers": view["brokers"] if admin else [{k: b.get(k) for k in ("name", "role", "console")}
                                                      for b in view["brokers"]],
            "shards": view["shards"] if admin else None, "age": view["age"], "totals": None, "rates": None,
            "mirror": None}
        if admin:
            latest, _ = self.samples.current()
            rows = latest.rows.values()
            answer["totals"] = {"queues": len(latest.rows), "queues_left_out": dict(latest.left_out),
                                "messages": sum(r.depth for r in rows), "bytes": sum(r.bytes for r in rows),
                                "connections": latest.connections, "memory_used": own["memory_used"],
                                "memory_alarm": own["memory_alarm"]}
            answer["rates"] = [list(rate) for rate in self.samples.broker_rates]
            answer["mirror"] = self._mirror(user)
        return _json(200, answer)

    def _mirror(self, user: str) -> dict[str, Any] | None:
        """`admin mirror status` (READ mirror), for the Overview's Mirror section; None on a broker without a `mirror:`
        section, which registers no such operation (before the console is plugged in: the dict is not changed
        after)."""
        if ("mirror", "READ") not in self.broker.management.operations:
            return None
        return _plain(self._read(user, "READ", "mirror", refusals=(403,)))

    def _alone(self, own: dict[str, Any] | None) -> dict[str, Any]:
        """A broker without HA as a cluster view shows one: itself, read now."""
        status = own if own is not None else on_loop(self.broker.engine.call_soon_threadsafe, self.broker.status, 5.0)
        return {"primary": None, "public": None, "shards": None, "age": 0.0,
                "brokers": [{"name": status["name"], "address": None, "role": status["role"],
                             "state": status["state"], "console": self.url, **build_fields(status)}]}

    # -- queues ------------------------------------------------------------------------------------
    def queues(self, call: Call) -> Reply:
        """One page of the queues the user may see, sorted and filtered here (a QUERY sorts by name only)."""
        query = call.request.query
        sort, order = query.get("sort", "name"), query.get("order", "asc")
        if sort not in SORTS or order not in ("asc", "desc"):
            raise Refusal(400, f"sort must be one of {', '.join(SORTS)} and order asc or desc")
        offset, limit = call.whole("offset", 0), call.whole("limit", PAGE_DEFAULT, PAGE_MOST)
        if self.shard is not None and "shard" in query:  # another shard's are its primary's to show
            asked = call.whole("shard", self.shard.index)
            if not asked < self.shard.shards:
                raise Refusal(400, f"no shard {asked}: the shards are 0 to {self.shard.shards - 1}")
            if asked != self.shard.index:
                raise self._elsewhere(asked, f"shard {asked}'s queue table")
        latest, _ = self.samples.current()
        sees = self.broker.management.queries.seer(call.session.user)  # QUERY's own permission cut
        rows = [r for r in latest.rows.values() if sees is None or sees(r.name)]
        matches = _matcher(query.get("filter", ""))
        if matches is not None:
            rows = [r for r in rows if matches(r.name)]
        if sort.startswith("rate_"):
            field = 1 if sort == "rate_in" else 2
            rates = {r.name: self.samples.queue_rate(r.name) for r in rows}
            rows.sort(key=lambda r: (rates[r.name] or (0, -1.0, -1.0))[field], reverse=order == "desc")
        else:
            rows.sort(key=lambda r: getattr(r, sort), reverse=order == "desc")
        page = rows[offset:offset + limit]
        return _json(200, {"total": len(rows), "offset": offset, "limit": limit, "taken": latest.taken,
                           "broker": self.broker.name, "shard": self.shard.index if self.shard is not None else None,
                           "shards": self.shard.shards if self.shard is not None else None,
                           "items": [self._queue_row(r) for r in page]})

    def _queue_row(self, row: QueueRow) -> dict[str, Any]:
        rate = self.samples.queue_rate(row.name)
        args = row.args
        return {"name": row.name, "depth": row.depth, "bytes": row.bytes, "consumers": row.consumers,
                "rate_in": None if rate is None else round(rate.rate_in, 1),
                "rate_out": None if rate is None else round(rate.rate_out, 1),
                "replicate": args.get("x-replicate", self._replicate_default()), "max_depth": args.get("max_depth", 0),
                "max_bytes": args.get("max_bytes", 0), "overflow": args.get("overflow", "block"),
                "args": {str(k): _plain(v) for k, v in args.items()}}

    def _replicate_default(self) -> str | None:
        return self.ha.config.replicate if self.ha is not None else None

    def queue(self, call: Call) -> Reply:
        name = call.name()
        info = self._ok(self._owned_here(call))
        rates = self.samples.watch(name)
        info["replicate"] = info["args"].get("x-replicate", self._replicate_default())
        info["broker"] = self.broker.name  # a shard's queue is shown by its shard's primary, maybe not the page's
        info["rates"] = [list(rate) for rate in rates]
        return _json(200, _plain(info))

    def peek(self, call: Call) -> Reply:
        count = call.whole("count", 10, 100)
        self._owned_here(call)
        found = self._ok(self.calls.request(call.session.user, "PEEK", "queue", call.name(), {"count": count}))
        return _json(200, {"messages": [{"seq": m["seq"], "state": m["state"], **describe(m["message"])}
                                        for m in found]})

    def declare_queue(self, call: Call) -> Reply:
        return self._declare(call, "queue", {})

    def delete_queue(self, call: Call) -> Reply:
        self._owned_here(call)
        return self._delete(call, "queue")

    def _declare(self, call: Call, type_: str, fields: dict[str, Any]) -> Reply:
        """CREATE of a queue (`{name, args}`) or an exchange (`{name, type, args}`: the type goes with the args)."""
        body = call.json()
        name, args = body.get("name"), body.get("args", {})
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            raise Refusal(400, f"a {type_} needs a \"name\" (a non-empty string) and may have \"args\" (an object)")
        answer = self.calls.request(call.session.user, "CREATE", type_, name, {**args, **fields})
        info = self._ok(answer)
        return _json(answer.status, _plain(info))

    def _delete(self, call: Call, type_: str) -> Reply:
        self._ok(self.calls.request(call.session.user, "DELETE", type_, call.name()))
        return _json(200, {"deleted": call.name()})

    def purge(self, call: Call) -> Reply:
        self._owned_here(call)
        return _json(200, self._ok(self.calls.request(call.session.user, "PURGE", "queue", call.name())))

    # -- shards ------------------------------------------------------------------------------------
    def _owned_here(self, call: Call) -> Answer:
        """The queue's READ; refused with where it is if another shard owns it: here it is a forwarding queue
        (messages in transit) or, auto-created at its owner, nothing."""
        name = call.name()
        answer = self.calls.request(call.session.user, "READ", "queue", name)
        if self.shard is not None:
            owner = answer.body["args"].get(FORWARD) if answer.status == 200 else \
                shard_of_name(name, self.shard.shards) if answer.status == 404 else None
            if owner is not None and owner != self.shard.index:
                raise self._elsewhere(int(owner), f"the queue {name}")
        return answer

    def _elsewhere(self, shard: int, what: str) -> Refusal:
        """421 and the console of the primary of `shard`, whose queues its console alone shows as they are."""
        found = [s for s in (self.cluster.view().get("shards") or []) if s["shard"] == shard] if self.cluster else []
        if not found or not found[0].get("console"):
            return Refusal(503, f"{what} is served by shard {shard}'s primary, and shard {shard} has no primary "
                                f"with a console now")
        return Refusal(421, f"{what} is served by shard {shard}'s primary {found[0]['primary']} at "
                            f"{found[0]['console']}", shard=shard, console=found[0]["console"])

    # -- exchanges, bindings, connections: a QUERY's page, as the management node answers it ------------
    def _page(self, call: Call, type_: str, body: dict[str, Any] | None = None) -> Reply:
        offset, limit = call.whole("offset", 0), call.whole("limit", PAGE_DEFAULT, PAGE_MOST)
        paging: dict[str, Any] = {"offset": offset, "count": limit}
        if call.request.query.get("filter"):
            paging["filter"] = call.request.query["filter"]
        answer = self.calls.request(call.session.user, "QUERY", type_, body=body or {}, paging=paging)
        items = self._ok(answer)
        return _json(200, {"total": answer.properties.get("total", len(items)), "offset": offset, "limit": limit,
                           "items": _plain(items)})

    def exchanges(self, call: Call) -> Reply:
        return self._page(call, "exchange")

    def declare_exchange(self, call: Call) -> Reply:
        return self._declare(call, "exchange", {"type": str(call.json().get("type", "direct"))})

    def delete_exchange(self, call: Call) -> Reply:
        return self._delete(call, "exchange")

    def bindings(self, call: Call) -> Reply:
        query = call.request.query
        return self._page(call, "binding", {k: query[k] for k in ("exchange", "queue") if query.get(k)})

    def bind(self, call: Call) -> Reply:
        return _json(201, _plain(self._ok(self.calls.request(call.session.user, "CREATE", "binding",
                                                             body=_binding(call.json())))))

    def unbind(self, call: Call) -> Reply:
        self._ok(self.calls.request(call.session.user, "DELETE", "binding", body=_binding(call.json())))
        return _json(200, {"deleted": True})

    def connections(self, call: Call) -> Reply:
        return self._page(call, "connection")

    def connection(self, call: Call) -> Reply:
        return _json(200, _plain(self._ok(self.calls.request(call.session.user, "READ", "connection", call.name()))))

    def close_connection(self, call: Call) -> Reply:
        reason = f"closed from the web console by {call.session.user}"
        self._ok(self.calls.request(call.session.user, "DELETE", "connection", call.name(), {"reason": reason}))
        return _json(200, {"closed": call.name()})

    # -- HA ------------------------------------------------------------------------------------
    def promote(self, call: Call) -> Reply:
        if self.ha is None:
            raise Refusal(409, f"{self.broker.name} is not in a cluster (no ha section)")
        force = bool(call.json().get("force", False))
        return _json(200, _plain(self._ok(self.calls.request(call.session.user, "PROMOTE", "ha",
                                                             body={"force": force}))))

    # -- the audit ------------------------------------------------------------------------------------
    def audit(self, call: Call) -> Reply:
        report = self._audit_report(call)
        if report is None:
            return _json(200, {"report": None, "events": self.audit_dir})
        with open(os.path.join(report, AUDIT_SUMMARY), encoding="utf-8", errors="replace") as f:
            summary = f.read()
        return _json(200, {"events": self.audit_dir, "report": report, "summary": summary,
                           "written": os.path.getmtime(os.path.join(report, AUDIT_SUMMARY)),
                           "chart": os.path.exists(os.path.join(report, AUDIT_CHART))})

    def audit_chart(self, call: Call) -> Reply:
        report = self._audit_report(call)
        if report is None or not os.path.exists(os.path.join(report, AUDIT_CHART)):
            raise Refusal(404, "no audit report with a lag chart")
        with open(os.path.join(report, AUDIT_CHART), "rb") as f:
            return Reply(200, f.read(), "image/png")

    def _audit_report(self, call: Call) -> str | None:
        """The newest `haqueue audit lag` report in audit.dir or a directory in it, or, where audit.dir is named
        after this broker (`cluster up --audit-dir DIR` gives each broker DIR/NAME, and the audit of them all is
        written beside them), in DIR or a directory in it (admins only: it names every queue)."""
        if self._read(call.session.user, "READ", "broker", refusals=(403,)) is None:
            raise Refusal(403, f"user '{call.session.user}' may not run admin operations (the audit report)")
        if self.audit_dir is None:
            raise Refusal(404, f"{self.broker.name} writes no audit events (no audit.dir)")
        roots = [self.audit_dir]
        if os.path.basename(os.path.normpath(self.audit_dir)) == self.broker.name:
            roots.append(os.path.dirname(os.path.normpath(self.audit_dir)))
        places = [p for root in roots if os.path.isdir(root)
                  for p in [root, *(e.path for e in os.scandir(root) if e.is_dir())]]
        found = [p for p in places if os.path.isfile(os.path.join(p, AUDIT_SUMMARY))]
        return max(found, key=lambda p: os.path.getmtime(os.path.join(p, AUDIT_SUMMARY)), default=None)

    # -- helpers ------------------------------------------------------------------------------------
    def _read(self, user: str, operation: str, type_: str, refusals: tuple[int, ...]) -> Any:
        """An answer's body; None if refused with one of `refusals`."""
        answer = self.calls.request(user, operation, type_)
        if answer.status in refusals:
            return None
        return self._ok(answer)

    @staticmethod
    def _ok(answer: Answer) -> Any:
        if answer.status >= 400:
            raise Refusal(answer.status, answer.description)
        return answer.body


_NOBODY = Session("", None, 0.0)  # who a public route's caller is before logging in


def _json(status: int, value: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, json.dumps(value, default=str).encode(), "application/json", headers or [])


def _plain(value: Any) -> Any:
    """An answer's AMQP values as JSON's (binary as base64, proton's symbols and numbers as theirs)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def _matcher(text: str) -> Callable[[str], bool] | None:
    """A glob (with * ? [) matches whole names, as a QUERY's filter; other text matches anywhere in them."""
    if not text:
        return None
    if any(c in text for c in "*?["):
        return re.compile(fnmatch.translate(text)).match  # type: ignore[return-value]
    return lambda name: text in name


def _binding(body: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(body.get("exchange"), str) or not isinstance(body.get("queue"), str):
        raise Refusal(400, "a binding needs \"exchange\" and \"queue\" (strings) and may have \"key\"")
    return {"exchange": body["exchange"], "queue": body["queue"], "key": str(body.get("key", ""))}


def _bearer(request: Request) -> str | None:
    scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _cookie(request: Request, name: str) -> str | None:
    for part in (request.headers.get("Cookie") or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value or None
    return None


NAME = r"(?P<name>[^/]+)"
LOGIN, LOGOUT, PROMOTE = re.compile(r"/api/login"), re.compile(r"/api/logout"), re.compile(r"/api/promote")
ROUTES: list[tuple[str, re.Pattern[str], Handler, int]] = [
    ("GET", re.compile(r"/api/session"), ConsoleApi.session, PUBLIC),
    ("POST", LOGIN, ConsoleApi.login, PUBLIC),
    ("POST", LOGOUT, ConsoleApi.logout, CHANGES),
    ("GET", re.compile(r"/api/overview"), ConsoleApi.overview, 0),
    ("GET", re.compile(r"/api/queues"), ConsoleApi.queues, 0),
    ("POST", re.compile(r"/api/queues"), ConsoleApi.declare_queue, CHANGES),
    ("GET", re.compile(rf"/api/queues/{NAME}"), ConsoleApi.queue, 0),
    ("DELETE", re.compile(rf"/api/queues/{NAME}"), ConsoleApi.delete_queue, CHANGES),
    ("GET", re.compile(rf"/api/queues/{NAME}/messages"), ConsoleApi.peek, 0),
    ("POST", re.compile(rf"/api/queues/{NAME}/purge"), ConsoleApi.purge, CHANGES),
    ("GET", re.compile(r"/api/exchanges"), ConsoleApi.exchanges, 0),
    ("POST", re.compile(r"/api/exchanges"), ConsoleApi.declare_exchange, CHANGES),
    ("DELETE", re.compile(rf"/api/exchanges/{NAME}"), ConsoleApi.delete_exchange, CHANGES),
    ("GET", re.compile(r"/api/bindings"), ConsoleApi.bindings, 0),
    ("POST", re.compile(r"/api/bindings"), ConsoleApi.bind, CHANGES),
    ("POST", re.compile(r"/api/bindings/delete"), ConsoleApi.unbind, CHANGES),
    ("GET", re.compile(r"/api/connections"), ConsoleApi.connections, 0),
    ("GET", re.compile(rf"/api/connections/{NAME}"), ConsoleApi.connection, 0),
    ("DELETE", re.compile(rf"/api/connections/{NAME}"), ConsoleApi.close_connection, CHANGES),
    ("POST", PROMOTE, ConsoleApi.promote, CHANGES),
    ("GET", re.compile(r"/api/audit"), ConsoleApi.audit, 0),
    ("GET", re.compile(r"/api/audit/lag\.png"), ConsoleApi.audit_chart, 0),
]
