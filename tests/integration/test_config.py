"""Config errors stop the broker with exit code 2, naming the file, the key and the reason."""
from __future__ import annotations

import pytest

from harness import BrokerProcess

pytestmark = pytest.mark.timeout(60)


def start_failing(tmp_path, config: dict) -> tuple[int, str]:
    b = BrokerProcess(tmp_path / "bad", config, name="bad")
    b.start(wait=False)
    try:
        code = b.wait(timeout=15)
    finally:
        b.kill()
    return code, b.log()


@pytest.mark.parametrize("config, key", [
    ({"no_such_key": 1}, "no_such_key"),
    ({"limits": {"max_frobs": 3}}, "max_frobs"),
    ({"listen": [{"address": "127.0.0.1:0", "max_frame_size": "big"}]}, "max_frame_size"),
    ({"listen": [{"address": "127.0.0.1:0", "sasl": "sometimes"}]}, "sasl"),
    ({"exchanges": [{"name": "x", "type": "bogus"}]}, "type"),
    ({"auto_create": "not-a-list"}, "auto_create"),
])
def test_bad_config_exits_2_naming_the_key(tmp_path, config, key):
    code, log = start_failing(tmp_path, config)
    assert code == 2, log
    assert key in log, log
    assert "broker.yaml" in log, log


def test_port_in_use_fails_clearly(tmp_path, broker):
    code, log = start_failing(tmp_path, {"listen": [broker.address]})
    assert code != 0, log
    assert str(broker.port) in log, log
