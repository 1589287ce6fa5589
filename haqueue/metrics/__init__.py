"""Prometheus metrics over HTTP (design/metrics.md): a plug-in that reads the broker, HA and the store
when scraped; nothing in broker/, ha/ or store/ knows of it."""
from .endpoint import serve_metrics

__all__ = ["serve_metrics"]
