"""The cluster as the console's overview shows it: every broker of `ha.brokers` with its role, state, epoch,
release, replication protocols and console, and each backup's readiness, lag and catch-up as the primary reports
them; for a sharded cluster, the shard map as `haqueue admin cluster status` gives it.

Each broker is asked what `haqueue admin` would ask (`READ broker`, `READ ha`) at its peer address, as the HA peer
user (with `ha.tls`), over connections kept open; this broker's own answers are read on its loop, and on a primary
a backup it has connected is not asked again (the primary's view of it is what the overview shows) until the
primary has it run another release (a rolling upgrade restarted it). A thread reads them once a second, and only
while a page has asked within the last IDLE_AFTER seconds: a closed page costs nothing, an open one on the
primary's console costs the cluster no request, and a dead broker's timeout never holds up a page (it shows what
was last read, and how old it is).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..admin import AdminClient, AdminError
from ..loop_calls import on_loop
from ..release import build_fields

if TYPE_CHECKING:
    from ..config import HaConfig, ShardConfig
    from ..ha.ha_broker import HaBroker

log = logging.getLogger("haqueue.console")

REFRESH_EVERY = 1.0  # seconds between two reads of the cluster while a page watches
IDLE_AFTER = 10.0  # seconds after the last page's request when reading stops
PEER_TIMEOUT = 1.0  # seconds a broker has to answer
FIRST_READ_WAIT = 2.0  # seconds a page waits for a first read (within the page's own 3 s for an answer)
UNREACHABLE = "unreachable"


class ClusterView:
    def __init__(self, ha: "HaBroker", shard: "ShardConfig | None") -> None:
        self.ha = ha
        self.config: HaConfig = ha.config
        self.shard = shard
        self.own = "%s:%d" % (ha.config_address.host, ha.config_address.port) if ha.config_address else None
        self._clients: dict[str, AdminClient] = {}
        # Each broker's answers by address, as last read: a broker that no longer answers is still named, and a
        # backup the primary has connected need not be asked again
        self._known: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._view: dict[str, Any] | None = None
        self._shard_primaries: dict[int, str] = {}  # each shard's primary as last read: asked first
        self._consoles: dict[str, str | None] = {}  # each process's console by name, once read
        self._wanted = 0.0  # time.monotonic() of the last request
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def view(self) -> dict[str, Any]:
        """The latest view (read now if there is none yet, or the reads had stopped), with its age."""
        with self._changed:
            self._wanted = time.monotonic()
            self._changed.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="console-cluster", daemon=True)
                self._thread.start()
            if self._view is None or time.time() - self._view["read_at"] > IDLE_AFTER:
                self._changed.wait_for(lambda: self._view is not None and
                                       time.time() - self._view["read_at"] <= IDLE_AFTER, FIRST_READ_WAIT)
            view = dict(self._view or {"primary": None, "brokers": [], "public": self._public(), "shards": None,
                                       "read_at": time.time()})  # not read in time: none known
        view["age"] = round(time.time() - view.pop("read_at"), 1)
        return view

    def _run(self) -> None:
        while True:
            with self._changed:
                if time.monotonic() - self._wanted >= IDLE_AFTER:
                    self._close_all()  # idle connections would be closed by the brokers' idle timeout anyway
                    self._changed.wait_for(lambda: time.monotonic() - self._wanted < IDLE_AFTER)
            started = time.monotonic()
            try:
                view = self._read()
            except Exception:  # noqa: BLE001 - a failed read is logged; the thread must go on
                log.exception("reading the cluster's status failed")
            else:
                with self._changed:
                    self._view = view
                    self._changed.notify_all()
            time.sleep(max(0.0, REFRESH_EVERY - (time.monotonic() - started)))  # the thread's own pace

    # -- reading -------------------------------------------------------------------------------------
    def _ask(self, address: str, operation: str, type_: str) -> dict[str, Any]:
        """An answer of the broker at `address`, over a connection kept open."""
        if address == self.own:  # a shard's layout names this process too
            read = self.ha.broker.status if type_ == "broker" else self.ha.status
            return on_loop(self.ha.broker.engine.call_soon_threadsafe, read, PEER_TIMEOUT * 5)
        for attempt in (1, 2):  # a connection kept open may have been closed meanwhile: then one new one
            kept = address in self._clients
            try:
                if not kept:
                    self._clients[address] = AdminClient(address, PEER_TIMEOUT, self.config.username,
                                                         self.config.password, self.config.tls)
                code, description, answer = self._clients[address].request(operation, type_)
                break
            except AdminError:
                self._drop(address)
                if not kept or attempt == 2:
                    raise
        if code >= 400:
            raise AdminError(f"{address}: {description}")
        return answer

    def _close_all(self) -> None:
        for address in list(self._clients):
            self._drop(address)

    def _drop(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def _read(self) -> dict[str, Any]:
        """Every broker's (READ broker, READ ha), or why it could not be had. On a primary, a backup it has
        connected is not asked: what the overview shows of it is the primary's view (its state, lag and catch-up)
        and what it said when last asked (its name and console), so that a page open on the primary's console
        costs the cluster no request at all once every backup is connected."""
        answers: dict[str, tuple[dict[str, Any], dict[str, Any]] | str] = {}
        own: tuple[dict[str, Any], dict[str, Any]] | None = None
        if self.own is not None:
            own = on_loop(self.ha.broker.engine.call_soon_threadsafe,
                          lambda: (self.ha.broker.status(), self.ha.status()), PEER_TIMEOUT * 5)
            answers[self.own] = own
        connected = {b["name"]: b for b in own[1].get("backups", [])} if own and own[1]["role"] == "primary" else {}
        for host, port in self.config.brokers:
            address = f"{host}:{port}"
            known = self._known.get(address)
            if address == self.own:
                continue
            if known is not None and known[0]["name"] in connected and own is not None:
                seen = connected[known[0]["name"]]
                if seen.get("release") == known[0].get("version"):  # else a rolling upgrade restarted it: ask it
                    answers[address] = ({k: known[0].get(k) for k in ("name", "console", "version", "protocols")},
                                        {"role": "backup", "state": seen["state"], "epoch": own[1]["epoch"]})
                    continue
            try:
                answers[address] = (self._ask(address, "READ", "broker"), self._ask(address, "READ", "ha"))
            except Exception as e:  # noqa: BLE001 - whatever kept it from answering is what the page shows
                answers[address] = str(e) or type(e).__name__
        self._known.update({address: answer for address, answer in answers.items() if not isinstance(answer, str)})
        view = cluster_brokers(answers, {address: answer[0]["name"] for address, answer in self._known.items()})
        view["public"] = self._public()
        view["shards"] = self._shards() if self.shard is not None else None
        view["read_at"] = time.time()
        return view

    def _public(self) -> str | None:
        return "%s:%d" % self.config.public if self.config.public else None

    def _shards(self) -> list[dict[str, Any]]:
        """`admin cluster status`'s report of every shard, each primary's console added. Its own answers cost
        one read of each shard's primary: a replica that primary lists as its backup is not asked (its state and
        lag are the primary's view, as for this shard's brokers above), so an open page costs each other process
        at most one READ ha a second."""
        from ..shard.status import cluster_status  # the same report as `admin cluster status`
        layout = on_loop(self.ha.broker.engine.call_soon_threadsafe,
                         lambda: self.ha.broker.management.operations[("cluster", "READ")][0](None, {})[1],
                         PEER_TIMEOUT * 5)
        answers: dict[str, dict[str, Any] | str] = {}
        addresses = {r["name"]: r["address"] for shard in layout["shards"] for r in shard["replicas"]}
        for shard in layout["shards"]:
            answers.update(self._shard_answers(shard["shard"], [r["name"] for r in shard["replicas"]], addresses))
        shards = cluster_status(layout, answers)["shards"]
        for shard in shards:
            shard["console"] = self._console(shard["primary"], addresses) if shard["primary"] else None
        return shards

    def _shard_answers(self, shard: int, names: list[str], addresses: dict[str, str]) -> dict[str, dict[str, Any] | str]:
        """Each replica's `READ ha`, or why it could not be had; the last primary is asked first, and the
        backups it lists are taken from its answer."""
        last = self._shard_primaries.get(shard)
        answers: dict[str, dict[str, Any] | str] = {}
        for name in sorted(names, key=lambda n: n != last):
            if name in answers:
                continue
            try:
                answer = answers[name] = self._ask(addresses[name], "READ", "ha")
            except Exception as e:  # noqa: BLE001 - whatever kept it from answering is what the map shows
                answers[name] = str(e) or type(e).__name__
                continue
            if answer["role"] == "primary":
                self._shard_primaries[shard] = name
                answers.update({b["name"]: {"role": "backup", "state": b["state"], "epoch": answer["epoch"]}
                                for b in answer.get("backups", []) if b["name"] in names and b["name"] not in answers})
        return answers

    def _console(self, name: str, addresses: dict[str, str]) -> str | None:
        """A process's console, asked once (a process's console does not move while it runs)."""
        if name not in self._consoles:
            try:
                self._consoles[name] = self._ask(addresses[name], "READ", "broker").get("console")
            except Exception:  # noqa: BLE001 - asked again on the next read
                return None
        return self._consoles[name]


def cluster_brokers(answers: dict[str, tuple[dict[str, Any], dict[str, Any]] | str],
                    names: dict[str, str]) -> dict[str, Any]:
    """The overview's `brokers` from each broker's (READ broker, READ ha), or why it did not answer: the primary
    is the one that says so with the highest epoch (a deposed one not yet fenced says so too, for a moment), and a
    backup's readiness and lag are the primary's view of it. A broker's release and replication protocols ([oldest,
    newest]) are what its `READ broker` says (release.build_of)."""
    read = {address: answer for address, answer in answers.items() if not isinstance(answer, str)}
    claims = [address for address, (_, ha) in read.items() if ha["role"] == "primary"]
    primary = max(claims, key=lambda address: read[address][1]["epoch"], default=None)
    seen = {b["name"]: b for b in read[primary][1].get("backups", [])} if primary is not None else {}
    brokers = []
    for address, answer in answers.items():
        if isinstance(answer, str):
            brokers.append({"name": names.get(address), "address": address, "role": None, "state": UNREACHABLE,
                            "error": answer})
            continue
        status, ha = answer
        broker: dict[str, Any] = {"name": status["name"], "address": address, "role": ha["role"],
                                  "state": ha["state"], "epoch": ha["epoch"], **build_fields(status),
                                  "console": status.get("console"),
                                  "connections": status.get("connections"), "queues": status.get("queues")}
        if address == primary:
            broker.update(sync=ha.get("sync"), min_confirmations=ha.get("min_confirmations"),
                          holders=ha.get("holders"), confirming=ha.get("confirming"))
        elif status["name"] in seen:  # the primary's view: the state that decides confirms, and the lag
            b = seen[status["name"]]
            broker.update(seen_by_primary=b["state"], ready=b["state"] == "ready", lag=b["lag"],
                          lag_seconds=b["lag_seconds"], catchup=b["catchup"])
        else:
            broker.update(seen_by_primary=None, ready=False)
        brokers.append(broker)
    return {"primary": read[primary][0]["name"] if primary is not None else None, "brokers": brokers}
