"""A shard converging on another's wiring takes the newer state of each object (wiring_versions.py, wiring_sync.py):
a delete it missed, but not what was made after; and it never gives back what another deleted."""
from __future__ import annotations

from haqueue.broker.flow import MemoryAlarm
from haqueue.broker.registry import Registry
from haqueue.shard.forwarding_queues import forwarding_args
from haqueue.shard.wiring_sync import converge, snapshot
from haqueue.shard.wiring_versions import STAMP, record, stamp_of, tombstones


class Shard:
    """One shard's registry (shard `index` of 2), with the broker's snapshot of it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.registry = Registry([], {}, lambda queue: None, MemoryAlarm(0))
        self.broker = self  # snapshot() reads broker.registry

    def exchange(self, name: str, stamp: float) -> None:
        self.registry.declare_exchange(name, "fanout", {STAMP: stamp})

    def queue(self, name: str, owner: int, stamp: float) -> None:
        args = {STAMP: stamp}
        self.registry.declare_queue(name, args if owner == self.index else forwarding_args(owner, args))

    def bind(self, exchange: str, queue: str, stamp: float) -> None:
        self.registry.bind(exchange, queue, "", {STAMP: stamp})

    def bound(self) -> set[tuple[str, str]]:
        return {(b.exchange.name, b.queue.name) for b in self.registry.bindings()}

    def snapshot(self) -> dict:
        return snapshot(self.broker, self.index)  # type: ignore[arg-type]

    def take(self, other: "Shard") -> tuple[int, int]:
        return converge(self.registry, self.index, other.snapshot())


def wired(index: int) -> Shard:
    """Exchange x and queue q of shard 0 bound at time 1, in shard `index`."""
    shard = Shard(index)
    shard.exchange("x", 1)
    shard.queue("q", 0, 1)
    shard.bind("x", "q", 1)
    return shard


def test_a_binding_deleted_in_the_others_goes_and_its_tombstone_stays() -> None:
    live, stale = wired(0), wired(1)
    live.registry.unbind("x", "q", "")
    record(live.registry, ("binding", "x", "q", ""), 5)  # as wiring_requests.apply does
    assert stale.take(live) == (0, 1)
    assert stale.bound() == set()
    assert tombstones(stale.registry) == {("binding", "x", "q", ""): 5}
    assert live.take(stale) == (0, 0) and live.bound() == set()  # not given back by the stale shard


def test_what_was_made_after_the_other_deleted_it_stays_and_is_taken() -> None:
    live, stale = wired(0), wired(1)
    stale.registry.unbind("x", "q", "")
    record(stale.registry, ("binding", "x", "q", ""), 5)
    live.registry.unbind("x", "q", "")
    live.bind("x", "q", 7)  # made again later, while the stale shard had no primary
    assert live.take(stale) == (0, 0) and live.bound() == {("x", "q")}
    assert stale.take(live) == (1, 0) and stale.bound() == {("x", "q")}


def test_a_binding_made_while_the_other_had_no_primary_is_not_dropped() -> None:
    newer, older = wired(0), wired(1)
    newer.exchange("y", 3)
    newer.bind("y", "q", 4)
    assert newer.take(older) == (0, 0) and newer.bound() == {("x", "q"), ("y", "q")}
    assert older.take(newer) == (2, 0) and older.bound() == {("x", "q"), ("y", "q")}


def test_an_exchange_deleted_and_made_again_takes_its_old_bindings() -> None:
    live, stale = wired(0), wired(1)
    live.registry.delete("x")  # its bindings went with it
    record(live.registry, ("exchange", "x"), 5)
    live.exchange("x", 6)
    live.bind("x", "q", 7)
    stale.registry.declare_queue("other", {STAMP: 1})
    stale.bind("x", "other", 2)  # made before the delete: gone with the old exchange
    assert stale.take(live) == (2, 1)  # the exchange removed, made again, and its one new binding
    assert stale.bound() == {("x", "q")}
    assert tombstones(live.registry) == tombstones(stale.registry) == {("exchange", "x"): 5}


def test_a_deleted_queue_goes_as_a_forwarding_queue_but_never_from_its_owner() -> None:
    owner, forwarding = wired(0), wired(1)
    owner.registry.delete("q")
    record(owner.registry, ("queue", "q"), 5)
    assert forwarding.take(owner) == (0, 1)
    assert forwarding.registry.lookup("q") is None and forwarding.bound() == set()
    late = wired(0)  # the owner is the first to delete its queue: a tombstone elsewhere never takes it
    record(forwarding.registry, ("queue", "q"), 9)
    assert late.take(forwarding)[1] == 0 and late.registry.lookup("q") is not None


def test_a_stamp_that_is_no_number_counts_as_the_oldest() -> None:
    assert stamp_of({STAMP: "yesterday"}) == stamp_of({STAMP: True}) == stamp_of({}) == 0.0
    assert stamp_of({STAMP: 5}) == 5.0
