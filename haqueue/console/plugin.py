"""Plugging the console into a broker: its listener bound at start (a taken port stops the broker, as a
listener's would), its URL added to the broker's status (so each console learns the others' from their
`READ broker`), and its server started on a thread of its own."""
from __future__ import annotations

import logging
import ssl
import threading
from typing import TYPE_CHECKING, Any

from proton import Message

from ..broker.tls import server_context
from ..config import HttpConfig, ShardConfig
from ..shard.cluster_config import host_port
from .api import ConsoleApi
from .cluster_view import ClusterView
from .http_server import ConsoleServer
from .logouts import Logouts
from .origins import Origins
from .sessions import Sessions

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha.ha_broker import HaBroker

log = logging.getLogger("haqueue.console")


def serve_console(broker: "Broker", config: HttpConfig, ha: "HaBroker | None" = None,
                  shard: ShardConfig | None = None, audit_dir: str | None = None) -> ConsoleServer:
    host, port = config.listen
    tls: ssl.SSLContext | None = server_context(config.tls, False, "http.tls") if config.tls is not None else None
    logouts = Logouts(broker.config.data_dir, _peers(ha, shard), ha.config if ha is not None else None)
    logouts.register(broker.management)
    sessions = Sessions(lambda user, password: broker.access.authenticate("PLAIN", user, password),
                        broker.access.anonymous, ha.config.password if ha is not None else None, logouts.ended,
                        ha.config.username if ha is not None else None)
    hosts = [host] + [listener.host for listener in broker.config.listen]
    if ha is not None:
        hosts += [h for h, _ in ha.config.brokers] + ([ha.config.public[0]] if ha.config.public else [])
    if shard is not None:  # a page may call any shard's consoles (a queue's is its shard's primary's)
        hosts += [h for replicas in shard.replicas for _, (h, _) in replicas] + [h for h, _ in shard.publics]
    _warm_up()
    # The cluster view's admin connections: proton logs each at INFO, once a second to a dead broker (the
    # supervisor quiets it alike).
    logging.getLogger("proton").setLevel(logging.WARNING)
    app = ConsoleApi(broker, sessions, logouts, Origins(hosts, config.allow_origins), ha,
                     ClusterView(ha, shard) if ha is not None else None, audit_dir, shard)
    try:
        server = ConsoleServer((host, port), app, tls)
    except OSError as e:
        raise OSError(e.errno, f"http.listen {host}:{port}: {e.strerror}") from None
    app.url = console_url(host, server.server_address[1], tls is not None, ha)
    broker.status_hooks.append(lambda status: status.__setitem__("console", app.url))
    threading.Thread(target=server.serve_forever, name="console-http", daemon=True).start()
    log.info("console on %s", app.url)
    return server


def _peers(ha: "HaBroker | None", shard: ShardConfig | None) -> list[str]:
    """The other brokers of the cluster, by peer address: the HA group's, or every shard's processes."""
    if ha is None:
        return []
    addresses = [a for replicas in shard.replicas for _, a in replicas] if shard is not None else ha.config.brokers
    own = (ha.config_address.host, ha.config_address.port) if ha.config_address is not None else None
    return [host_port(*a) for a in addresses if a != own]


def console_url(host: str, port: int, tls: bool, ha: "HaBroker | None") -> str:
    """Where a browser reaches this console: its listener's address, or for a wildcard one (0.0.0.0) this
    broker's address in ha.brokers."""
    if host in ("0.0.0.0", "::", "") and ha is not None and ha.config_address is not None:
        host = ha.config_address.host
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/"


def _warm_up() -> None:
    """proton's cffi module completes its C types on first use, and two threads doing that at once failed
    (coord/supervisor.py): the console's threads decode messages and the loop encodes answers, so both are used
    once here, before either thread runs."""
    data: Any = Message(id="x", body={"warm": [1, 2.0, b"up"]}, properties={"a": 1}).encode()
    Message().decode(data)
