"""The test cluster of pcmk_cluster.py as a mirror's source (design/mirroring.md): each broker's `mirror:` section
names the standby, a broker in the root namespace, through the delaying relay (25 ms each way,
tests/mirror/delay_relay.py), which listens on the bridge's address. Only the `orders.*` queues are mirrored."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from pcmk_cluster import HOST_ADDRESS, Node, PacemakerCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mirror"))
from delay_relay import DelayRelay  # noqa: E402
from mirror_harness import MIRROR_PASSWORD, MIRROR_USER, SITE_DELAY, standby_config  # noqa: E402, F401

MIRRORED = "orders.*"


class MirroredCluster(PacemakerCluster):
    """The test cluster as a mirror's source (cluster `site-a`): the relay to the standby is made once the bridge
    is up (its address is the relay's), before the nodes' configs are written."""

    def __init__(self, standby: str) -> None:
        super().__init__()
        host, port = standby.rsplit(":", 1)
        self.standby = (host, int(port))
        self.relay: DelayRelay | None = None

    def _network(self) -> None:
        super()._network()
        self.relay = DelayRelay(self.standby, SITE_DELAY, host=HOST_ADDRESS)

    def write_broker_configs(self, node: Node) -> None:
        super().write_broker_configs(node)
        assert self.relay is not None
        path = node.dir("etc-haqueue") / "haqueue.yaml"
        config = yaml.safe_load(path.read_text())
        config["mirror"] = {"cluster": "site-a", "to": [self.relay.address], "username": MIRROR_USER,
                            "password": MIRROR_PASSWORD, "queues": [MIRRORED]}
        self.write_broker_config(node, path.name, config)

    def destroy(self) -> None:
        super().destroy()
        if self.relay is not None:
            self.relay.close()

    def mirror(self, node: Node) -> dict[str, Any]:
        """The source's part of the node's `admin mirror status`."""
        with self.admin(node) as client:
            code, description, answer = client.request("READ", "mirror")
        assert code == 200, description
        return answer["source"]
