"""A broker's HA role and state, and the cluster epoch persisted in its data dir."""
from __future__ import annotations

import json
import os

PRIMARY, BACKUP = "primary", "backup"
# backup states
JOINING, CATCHUP, READY = "joining", "catchup", "ready"
# primary states
RECOVERING, ACTIVE = "recovering", "active"


class EpochStore:
    """The highest epoch this broker has seen. Written atomically so a crash never leaves half a file."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, "ha-epoch.json")
        self.epoch = 0
        self.had_primary = False  # has this broker ever followed or been a primary?
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            self.epoch = int(saved.get("epoch", 0))
            self.had_primary = bool(saved.get("had_primary", self.epoch > 0))

    def raise_to(self, epoch: int) -> None:
        if epoch > self.epoch or not self.had_primary:
            self.epoch = max(epoch, self.epoch)
            self.had_primary = True
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"epoch": self.epoch, "had_primary": True}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
