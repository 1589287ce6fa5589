"""Fault injection for tests, off unless the test harness sets its environment variable (never a
config key: nobody turns it on by mistake; a broker running with one logs a warning at start).

HAQUEUE_TEST_DROP_REPLICA=QUEUE:N  As a backup, drop the N-th live message received for QUEUE on a
                                   replication link (counted from 1) yet acknowledge it as kept: the
                                   primary confirms it, trusting this backup holds it, and this
                                   backup logs no `replicate`. The audit tests plant a loss this way.
HAQUEUE_TEST_HOLD_CAUGHT_UP=GLOB   As a primary, never tell a backup it has caught up on a queue whose name
                                   matches GLOB (fnmatch): backups that subscribed to one stay `catchup`.
HAQUEUE_TEST_REFUSE_QUEUE=QUEUE    As a primary, refuse every backup's replication link for QUEUE.
HAQUEUE_TEST_STOP_IN_CATCHUP=QUEUE:N  As a backup, stop its own process (SIGSTOP) on receiving the N-th
                                   catch-up message for QUEUE: its primary, short of credit, holds the
                                   rest, so a test sees the catch-up part way until it sends SIGCONT.
HAQUEUE_TEST_SUBSCRIBING=N         As a backup, subscribe to at most N queues at a time, not backup.SUBSCRIBING:
                                   a test fills the window with a few hundred queues, not thousands.
HAQUEUE_TEST_PROTOCOLS=OLDEST-NEWEST  Announce these replication protocols to peers, as a build of another
                                   release would (design/upgrades.md): the tests of a peer refused for a
                                   protocol it does not share.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import signal
from typing import Final

log = logging.getLogger("haqueue.ha")

DROP_REPLICA = "HAQUEUE_TEST_DROP_REPLICA"
HOLD_CAUGHT_UP = "HAQUEUE_TEST_HOLD_CAUGHT_UP"
REFUSE_QUEUE = "HAQUEUE_TEST_REFUSE_QUEUE"
STOP_IN_CATCHUP = "HAQUEUE_TEST_STOP_IN_CATCHUP"
PROTOCOLS = "HAQUEUE_TEST_PROTOCOLS"
SUBSCRIBING = "HAQUEUE_TEST_SUBSCRIBING"

# Read once: a broker's environment is set before it starts, and asking os.environ for each of 10,000 queue links
# was 3 % of a new primary's CPU as its backups re-subscribed.
_SET: Final = {name: os.environ[name] for name in (DROP_REPLICA, HOLD_CAUGHT_UP, REFUSE_QUEUE, STOP_IN_CATCHUP,
                                                  PROTOCOLS, SUBSCRIBING) if name in os.environ}


def _numbered(variable: str, queue: str) -> int:
    """N of a `QUEUE:N` hook naming `queue`; 0: none."""
    name, _, number = _SET.get(variable, "").rpartition(":")
    return int(number) if name == queue and number.isdigit() else 0


def replica_to_drop(queue: str) -> int:
    """The number of the live message to drop on `queue`'s replication link; 0: none."""
    return _numbered(DROP_REPLICA, queue)


def catchup_stop(queue: str) -> int:
    """The number of the catch-up message for `queue` on whose receipt this process stops itself; 0: none."""
    return _numbered(STOP_IN_CATCHUP, queue)


def stop_process() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def caught_up_held(queue: str) -> bool:
    """Is the caught-up marker for `queue` never to be sent?"""
    glob = _SET.get(HOLD_CAUGHT_UP)
    return glob is not None and fnmatch.fnmatchcase(queue, glob)


def link_refused(queue: str) -> bool:
    """Is every backup's replication link for `queue` to be refused?"""
    return _SET.get(REFUSE_QUEUE) == queue


def subscribing(default: int) -> int:
    """How many queues a backup subscribes to at a time: `default` unless a test says."""
    value = _SET.get(SUBSCRIBING, "")
    return int(value) if value.isdigit() else default


def announced_protocols() -> tuple[int, int] | None:
    """The (oldest, newest) replication protocols to announce instead of this build's; None: this build's."""
    return protocols(_SET.get(PROTOCOLS, ""))


def protocols(hook: str) -> tuple[int, int] | None:
    """(oldest, newest) of a protocols hook's value, "OLDEST-NEWEST" (this one's, or the mirror's); None: unset."""
    oldest, _, newest = hook.partition("-")
    return (int(oldest), int(newest)) if oldest.isdigit() and newest.isdigit() else None


_WARNINGS: Final = {
    DROP_REPLICA: "this backup will drop a replicated message",
    HOLD_CAUGHT_UP: "as primary, this broker never lets a backup catch up on it",
    REFUSE_QUEUE: "as primary, this broker refuses that queue's replication links",
    STOP_IN_CATCHUP: "as backup, this broker stops its own process part way through a catch-up",
    PROTOCOLS: "this broker announces replication protocols it does not speak",
    SUBSCRIBING: "as backup, this broker subscribes to that many queues at a time",
}


def warn_if_set() -> None:
    for name, value in _SET.items():
        log.warning("TEST HOOK %s=%s is set: %s", name, value, _WARNINGS[name])
