"""The metrics endpoint: an HTTP server thread serving /metrics, and the collector behind it.

A scrape runs on the server's thread, but the values it reads belong to the broker's event loop, which
changes them without locks. So the collector asks the loop (`call_soon_threadsafe`) to copy them into
plain values between two passes, waits for that copy, and turns it into metric families on its own
thread: the numbers are consistent with each other, the loop pays only for the copy, and only when
scraped. A loop that does not answer within SNAPSHOT_TIMEOUT fails the scrape (HTTP 503), so Prometheus
shows the broker down rather than stale numbers.
"""
from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..config import MetricsConfig
from ..loop_calls import LoopUnresponsive, on_loop
from .broker_metrics import BrokerSource
from .ha_metrics import HaSource
from .mirror_metrics import mirror_metrics
from .store_metrics import StoreSource

if TYPE_CHECKING:
    from ..broker.server import Broker
    from ..ha.ha_broker import HaBroker
    from ..store.store import Store

log = logging.getLogger("haqueue.metrics")

PATH = "/metrics"
SNAPSHOT_TIMEOUT = 5.0  # seconds a scrape waits for the broker's loop


class Source(Protocol):
    """One part of the metrics: `sample` copies values on the broker's thread, `families` makes the
    metrics of such a copy on the scrape's thread."""

    def sample(self) -> Any: ...

    def families(self, sample: Any) -> Iterable[Metric]: ...


class LoopCollector(Collector):
    """A prometheus_client collector whose values are copied on the broker's loop at each scrape."""

    def __init__(self, call_soon_threadsafe: Callable[[Callable[[], None]], None], sources: list[Source]) -> None:
        self.call_soon_threadsafe = call_soon_threadsafe
        self.sources = sources

    def describe(self) -> list[Metric]:
        return []  # no fixed set of names to check at registration: they depend on the sources

    def collect(self) -> Iterator[Metric]:
        samples = self._snapshot()
        for source, sample in zip(self.sources, samples):
            yield from source.families(sample)

    def _snapshot(self) -> list[Any]:
        try:
            return on_loop(self.call_soon_threadsafe, lambda: [source.sample() for source in self.sources],
                           SNAPSHOT_TIMEOUT)
        except LoopUnresponsive:
            raise
        except Exception as e:  # noqa: BLE001 - a source failed on the loop: the scrape fails, saying so
            log.exception("reading the broker's values failed")
            raise LoopUnresponsive(f"reading the broker's values failed: {e!r}") from e


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request line per scrape is noise in the broker's log


def metrics_app(collector: LoopCollector) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: Prometheus text (or OpenMetrics, as asked) at /metrics, 404 elsewhere, 503 if the loop
    does not answer."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"metrics are at {PATH}\n".encode()]
        try:
            return exposition(environ, start_response)
        except LoopUnresponsive as e:
            log.warning("metrics scrape failed: %s", e)
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"{e}\n".encode()]
    return app


def serve_metrics(broker: "Broker", config: MetricsConfig, ha: "HaBroker | None" = None,
                  store: "Store | None" = None) -> WSGIServer:
    """The broker plug-in: bind config.listen now (a taken port stops the broker at start, as a listener's
    would) and serve scrapes on a thread of their own."""
    sources: list[Source] = [BrokerSource(broker)]
    if ha is not None:
        sources.append(HaSource(ha))
    if store is not None:
        sources.append(StoreSource(store))
    mirror = mirror_metrics(broker.management.operations)  # plugged in before the metrics (cli.py)
    if mirror is not None:
        sources.append(mirror)
    host, port = config.listen
    try:
        server = make_server(host, port, metrics_app(LoopCollector(broker.engine.call_soon_threadsafe, sources)),
                             _Server6 if ":" in host else _Server, handler_class=_QuietHandler)
    except OSError as e:
        raise OSError(e.errno, f"metrics.listen {host}:{port}: {e.strerror}") from None
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on http://%s:%d%s", host, port, PATH)
    return server
