"""A broker's HA role and state, and the cluster epoch persisted in its data dir."""
from __future__ import annotations

import json
import os

from .. import formats

PRIMARY, BACKUP = "primary", "backup"
# backup states
JOINING, CATCHUP, READY = "joining", "catchup", "ready"
# primary states
RECOVERING, ACTIVE = "recovering", "active"
# A broker's standing in its epoch, persisted: how complete its store was when last it knew.
OUTSIDE, WAS_READY, WAS_PRIMARY = 0, 1, 2
# Set in its environment by a broker that re-executes itself as a backup (fenced, or resigned): it is a member
# of a running cluster, so a coordinator out of reach is waited for, not a reason to exit as at a first start.
RESTARTED_ENV = "HAQUEUE_HA_RESTARTED"
LED_KEPT = 16  # epochs led that a broker remembers (an older one's messages would be adopted: a duplicate at worst)
# ha-epoch.json's format (formats.py): 0.1.0 wrote none (format 1) and reads this one as its own, ignoring the key.
EPOCH_FORMAT = 1


class EpochStore:
    """The highest epoch this broker has seen; the latest it held data of (served in or followed) and
    its standing there (the primary, a ready backup, or neither): after a total outage the coordinators
    promote the broker that stood highest in the latest epoch held (design/store.md). Seeing a newer
    epoch go by (a ZooKeeper election) changes neither: it brings no data. Written atomically so a
    crash never leaves half a file. A file of a newer format is refused (formats.NewerFormat)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, "ha-epoch.json")
        self.epoch = 0
        self.had_primary = False  # has this broker ever followed or been a primary?
        self.held = 0  # the latest epoch this broker served in or followed
        self.standing = OUTSIDE  # in `held`
        # Epochs this broker was the primary of (the latest few): it numbered their messages itself, so one of
        # them that a later primary never had was never replicated (a rejoin keeps it aside, does not adopt it).
        self.led: list[int] = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            formats.check_document(self.path, saved, EPOCH_FORMAT)
            self.epoch = int(saved.get("epoch", 0))
            self.had_primary = bool(saved.get("had_primary", self.epoch > 0))
            self.held = int(saved.get("held", self.epoch))
            self.standing = int(saved.get("standing", OUTSIDE))
            self.led = [int(e) for e in saved.get("led", [])]

    def raise_to(self, epoch: int) -> None:
        """A newer epoch seen: primaries of older ones are refused from now on."""
        if epoch > self.epoch or not self.had_primary:
            self.epoch = max(epoch, self.epoch)
            self.had_primary = True
            self._save()

    def hold(self, epoch: int) -> None:
        """This broker follows or serves as the primary of `epoch`: it has nothing of it yet."""
        self.raise_to(epoch)
        if epoch != self.held:
            self.held = epoch
            self.standing = OUTSIDE
            self._save()

    def lead(self) -> None:
        """This broker is the primary of the epoch it holds."""
        if self.held not in self.led:
            self.led = [*self.led, self.held][-LED_KEPT:]
            self._save()

    def stand(self, standing: int) -> None:
        if standing != self.standing:
            self.standing = standing
            self._save()

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({formats.MARKER: EPOCH_FORMAT, "epoch": self.epoch, "had_primary": self.had_primary,
                       "held": self.held, "standing": self.standing, "led": self.led}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
