"""Helpers for the mirror tests: a standby behind a delaying relay (25 ms each way, delay_relay.py) and a source
cluster mirroring to it through the relay, and the clients' ledger.

`sites_factory`  the body of the `sites` fixture (conftest.py), which yields
                 ``sites(queues=["orders.*"], standby_size=0, standby_features=None, tls=False, back=False)``: it
                 starts the standby, the relay in front of it, and a 2-broker source cluster whose `mirror:` section
                 names the relay and the globs, and returns a `Sites` with the source cluster (`source`, its primary
                 `primary`), the standby (`standby`, its primary if it is a cluster, `standby_cluster`), `relay`
                 and `ledger`. With `standby_size` 0 the standby is a broker of no cluster accepting the mirror
                 user, else a cluster of that size (a pair confirms with one broker down) whose public address the
                 relay leads to; `standby_features`: the feature flags it knows enabled (as a cluster upgraded from
                 a release without the others). With `tls`, the relay leads to a TLS listener of the standby's (a
                 second one: its first, plain, serves the test's clients) and the source mirrors over TLS. With
                 `back`, the standby (of no cluster) may mirror back for a fail-back: its `mirror:` section names
                 cluster `site-b`, the same globs, and a second relay (`relay_back`) in front of the source's public
                 address; the source accepts it once `accept_back` was applied to its brokers' configs (before they
                 start again). With `standby_env`, the standby runs with those environment variables (test hooks).
                 With `source_goes_on`, the source pair goes on confirming with one broker down (PAIR_GOES_ON): its
                 backup, promoted after a kill of its primary, serves the clients alone.
                 Everything is stopped after the test.
`Side`           one side of ha_harness.Load on a queue, its producer or its consumer alone, each with its ledger
                 (`confirmed`, `received`, by body).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from delay_relay import DelayRelay
from ha_harness import PAIR_GOES_ON, HaCluster, Load, cluster_factory  # tests/conftest.py puts tests/ha on the path
from harness import BrokerProcess, unexpected_exits
from tls_certs import CertificateAuthority

MIRROR_USER, MIRROR_PASSWORD = "mirror", "mirror-secret"
SITE_DELAY = 0.025  # seconds each way between the sites: 50 ms round trip
MAX_BACKLOG_BYTES = 3000  # the sources' mirror.max_backlog_bytes: a queue's 100 messages not mirrored are over it


class Ledger:
    """The clients' record, per queue: the message ids confirmed at the source in the order sent, and those consumed
    there. What a queue should hold is the first less the second, in that order."""

    def __init__(self) -> None:
        self.confirmed: dict[str, list[str]] = {}
        self.consumed: dict[str, set[str]] = {}

    def remaining(self, queue: str) -> list[str]:
        gone = self.consumed.get(queue, set())
        return [i for i in self.confirmed.get(queue, []) if i not in gone]


@dataclass
class Sites:
    source: HaCluster
    primary: BrokerProcess
    standby: BrokerProcess
    standby_cluster: HaCluster | None
    relay: DelayRelay
    relay_back: DelayRelay | None = None
    ledger: Ledger = field(default_factory=Ledger)


class Side(Load):
    """A Load's producer (bodies from `first`, each confirmed before the next, reconnecting through the source's
    public address) or its consumer (accepting each) alone."""

    def __init__(self, address: str, queue: str, producer: bool, first: int = 0) -> None:
        super().__init__(address, queue, first)
        self.threads = self.threads[:1] if producer else self.threads[1:]


def accept_back(config: dict[str, Any]) -> None:
    """A source broker's config made to accept the standby's mirror back (a fail-back): the mirror user, accepted."""
    config["users"][MIRROR_USER] = {"password": MIRROR_PASSWORD, "allow": {}}
    config["mirror"]["accept_from"] = [MIRROR_USER]


def standby_config(**extra: Any) -> dict[str, Any]:
    """A standby broker's config: the mirror user, which may do nothing but mirror, accepted. Its clients may have
    2 links a connection: the source's connection, with a link per mirrored queue, is held to no client limit."""
    return {"listen": ["127.0.0.1:0"], "users": {MIRROR_USER: {"password": MIRROR_PASSWORD, "allow": {}}},
            "mirror": {"accept_from": [MIRROR_USER]}, "limits": {"max_links_per_connection": 2}, **extra}


def sites_factory(tmp_path: Path) -> Iterator[Callable[..., Sites]]:
    alone: list[BrokerProcess] = []  # standbys of no cluster
    relays: list[DelayRelay] = []
    clusters = cluster_factory(HaCluster, tmp_path)
    make_cluster = next(clusters)

    def make(queues: list[str], standby_size: int = 0, standby_features: list[str] | None = None,
             tls: bool = False, back: bool = False, standby_env: dict[str, str] | None = None,
             source_goes_on: bool = False, source_extra: dict[str, Any] | None = None) -> Sites:
        cluster = None
        mirror: dict[str, Any] = {"cluster": "site-a", "username": MIRROR_USER, "password": MIRROR_PASSWORD,
                                  "queues": queues, "max_backlog_bytes": MAX_BACKLOG_BYTES}
        # started last, once its mirror names the relay
        source = make_cluster(size=2, extra={"mirror": mirror, **(source_extra or {})},
                              ha_extra=PAIR_GOES_ON if source_goes_on else None)
        relay_back = None
        if standby_size == 0:
            extra: dict[str, Any] = {}
            if back:
                assert source.public is not None
                host, port = source.public.rsplit(":", 1)
                relay_back = DelayRelay((host, int(port)), SITE_DELAY)
                relays.append(relay_back)
                extra = {"mirror": {"accept_from": [MIRROR_USER], "cluster": "site-b", "to": [relay_back.address],
                                    "username": MIRROR_USER, "password": MIRROR_PASSWORD, "queues": queues}}
            if tls:
                ca = CertificateAuthority(tmp_path / "ca", "ca")
                extra = {"listen": ["127.0.0.1:0", {"address": "127.0.0.1:0", "tls": True}],
                         "tls": ca.issue("standby").config()}
                mirror["tls"] = ca.issue("site-a").config()
            standby = BrokerProcess(tmp_path / "standby", standby_config(**extra), name="standby",
                                    env=standby_env).start()
            alone.append(standby)
            target = standby.addresses[-1]
        else:
            cluster = make_cluster(size=standby_size, extra=standby_config(), ha_extra=PAIR_GOES_ON)
            if standby_features is not None:
                for b in cluster:
                    features = Path(b.config["data_dir"]) / "ha-features.json"
                    features.parent.mkdir(parents=True, exist_ok=True)
                    features.write_text(json.dumps({"format": 1, "enabled": standby_features}))
            standby = cluster.start_cluster()
            assert cluster.public is not None
            target = cluster.public
        host, port = target.rsplit(":", 1)
        relay = DelayRelay((host, int(port)), SITE_DELAY)
        relays.append(relay)
        mirror["to"] = [relay.address]
        for broker in source:  # each broker's config is its own copy, made before the standby was
            broker.config["mirror"] = dict(mirror)
        return Sites(source, source.start_cluster(), standby, cluster, relay, relay_back)

    yield make
    for relay in relays:
        relay.close()
    crashed = unexpected_exits(alone)
    for standby in alone:
        standby.stop()
        print(standby.log()[-4000:])
    next(clusters, None)  # stops the clusters, prints their logs
    assert not crashed, crashed
