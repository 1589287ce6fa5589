"""A broker's HA role and state, and the cluster epoch persisted in its data dir."""
from __future__ import annotations

import json
import os

PRIMARY, BACKUP = "primary", "backup"
# backup states
JOINING, CATCHUP, READY = "joining", "catchup", "ready"
# primary states
RECOVERING, ACTIVE = "recovering", "active"
# A broker's standing in its epoch, persisted: how complete its store was when last it knew.
OUTSIDE, WAS_READY, WAS_PRIMARY = 0, 1, 2


class EpochStore:
    """The highest epoch this broker has seen, and its standing in it (the primary, a ready backup, or
    neither): after a total outage the coordinators promote the broker that stood highest in the
    latest epoch (design/store.md). Written atomically so a crash never leaves half a file."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, "ha-epoch.json")
        self.epoch = 0
        self.had_primary = False  # has this broker ever followed or been a primary?
        self.standing = OUTSIDE
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            self.epoch = int(saved.get("epoch", 0))
            self.had_primary = bool(saved.get("had_primary", self.epoch > 0))
            self.standing = int(saved.get("standing", OUTSIDE))

    def raise_to(self, epoch: int) -> None:
        """A newer epoch: this broker has nothing of it yet."""
        if epoch > self.epoch or not self.had_primary:
            self.epoch = max(epoch, self.epoch)
            self.had_primary = True
            self.standing = OUTSIDE
            self._save()

    def stand(self, standing: int) -> None:
        if standing != self.standing:
            self.standing = standing
            self._save()

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"epoch": self.epoch, "had_primary": self.had_primary, "standing": self.standing}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
