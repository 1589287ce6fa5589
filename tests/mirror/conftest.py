"""Fixtures for the mirror tests: a standby broker behind a delaying relay (25 ms each way) and a source cluster
mirroring to it through the relay, all stopped after the test.

`sites`  ``sites(queues=["orders.*"])``: starts the standby (a broker of no cluster accepting the mirror user),
         the relay in front of it, and a 2-broker source cluster whose `mirror:` section names the relay and the
         globs; returns a `Sites` with the source cluster (`source`, its primary `primary`), `standby` and `relay`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ha"))

from delay_relay import DelayRelay  # noqa: E402
from ha_harness import HaCluster, cluster_factory  # noqa: E402
from harness import BrokerProcess, unexpected_exits  # noqa: E402

MIRROR_USER, MIRROR_PASSWORD = "mirror", "mirror-secret"
SITE_DELAY = 0.025  # seconds each way between the sites: 50 ms round trip


@dataclass
class Sites:
    source: HaCluster
    primary: BrokerProcess
    standby: BrokerProcess
    relay: DelayRelay


def standby_config(**extra: Any) -> dict[str, Any]:
    """A standby broker's config: the mirror user, which may do nothing but mirror, accepted."""
    return {"listen": ["127.0.0.1:0"], "users": {MIRROR_USER: {"password": MIRROR_PASSWORD, "allow": {}}},
            "mirror": {"accept_from": [MIRROR_USER]}, **extra}


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Callable[..., Sites]]:
    made: list[Sites] = []
    clusters = cluster_factory(HaCluster, tmp_path)
    make_cluster = next(clusters)

    def make(queues: list[str]) -> Sites:
        standby = BrokerProcess(tmp_path / "standby", standby_config(), name="standby").start()
        host, port = standby.address.rsplit(":", 1)
        relay = DelayRelay((host, int(port)), SITE_DELAY)
        mirror = {"cluster": "site-a", "to": [relay.address], "username": MIRROR_USER, "password": MIRROR_PASSWORD,
                  "queues": queues}
        source = make_cluster(size=2, extra={"mirror": mirror})
        site = Sites(source, source.start_cluster(), standby, relay)
        made.append(site)
        return site

    yield make
    for site in made:
        site.relay.close()
        crashed = unexpected_exits([site.standby])
        site.standby.stop()
        print(site.standby.log()[-4000:])
        assert not crashed, crashed
    next(clusters, None)  # stops the source clusters, prints their logs
