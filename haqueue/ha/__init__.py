"""Hot-standby replication, plugged into the broker core through its named hooks."""
from .ha_broker import HaBroker

__all__ = ["HaBroker"]
