"""The durable store: a journal of durable wiring and messages on every broker (design/store.md)."""
from .store import Store

__all__ = ["Store"]
