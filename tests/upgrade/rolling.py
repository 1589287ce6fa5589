"""A rolling upgrade of a `haqueue cluster up` cluster under load, as README's procedure does it, for the tests
and bench/upgrade.py: the old release installed (a symlink to its tree), the cluster started on it, a producer
and a consumer running; then the new release installed where the old one was (the symlink re-pointed, as an
install replaces the files) and each broker stopped in turn, backups first, the supervisor (the old release's,
still running) restarting it from the new files; the primary last, when the supervisor fails over to an
upgraded backup. Each step waits until the broker is a ready backup of the new release and 200 more publishes
are confirmed. Then, still under load, the new release's feature flags are enabled (`haqueue admin cluster
upgrade-check` and `features enable` at the primary) and every broker keeps them in its data directory."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ha_harness import HA_USER, Load, enable_new_features, features_enabled, wait_for
from harness import run_haqueue
from test_ha_supervisor import Supervised

BROKERS = ("broker-0", "broker-1", "broker-2")


@dataclass
class Outcome:
    before: set[str | None]  # the releases the brokers ran before, as their status said
    after: set[str | None]  # and after
    report: dict[str, Any]  # the load's, checked (ha_harness.Load.assert_at_least_once)
    steps: list[dict[str, Any]]  # the clients' outage in each step (ha_harness.Load.step)
    failover: dict[str, Any] | None  # the same for a kill -9 of the upgraded primary (kill_primary)


def cluster_up(directory: Path, old: Path, new: Path, logs: bool = True, kill_primary: bool = False,
               features: tuple[str, ...] = ()) -> Outcome:
    """Upgrade a 3-broker `cluster up` cluster, run from `old` (a haqueue tree), to `new`, under load, asserting
    that no confirmed message was lost nor more duplicated than was in flight, then enable `features` (the flags
    `new` has and `old` had not: design/upgrades.md's last step); with `kill_primary`, then kill -9
    its primary to measure a failover's outage alike; with `logs`, print the tails of the brokers' logs at the end
    (pytest shows them with a failure)."""
    installed = directory / "installed"
    installed.symlink_to(old)
    (directory / "cluster").mkdir()
    s = Supervised(directory / "cluster", len(BROKERS), code=installed)
    try:
        s.read_until("public ", 60)
        addresses = {name: f"127.0.0.1:{s.base + i}" for i, name in enumerate(BROKERS)}

        def version(name: str) -> str | None:
            try:
                with s.admin(addresses[name]) as a:
                    return a.request("READ", "broker")[2]["version"]
            except Exception:  # noqa: BLE001 - restarting
                return None

        def role(name: str) -> tuple[str, str] | None:
            status = s.status(addresses[name])
            return (status["role"], status["state"]) if status else None

        def upgrade(name: str) -> None:
            """Stop it; the supervisor starts it again from the installed files."""
            old_version = version(name)
            os.kill(s.broker_pid(name), signal.SIGTERM)
            wait_for(lambda: version(name) not in (None, old_version), 60,
                     message=f"{name} restarted by the supervisor on the new release")
            wait_for(lambda: role(name) == ("backup", "ready"), 60, message=f"{name} a ready backup again")

        def kill(name: str) -> None:
            os.kill(s.broker_pid(name), signal.SIGKILL)
            wait_for(lambda: role(name) == ("backup", "ready"), 60, message=f"{name} back after its kill")

        def primary() -> str:
            return next(n for n in BROKERS if role(n) == ("primary", "active"))

        wait_for(lambda: sorted(role(n) for n in BROKERS) == [("backup", "ready")] * 2 + [("primary", "active")],
                 30, message="a primary and two ready backups")
        before = {version(name) for name in BROKERS}
        load = Load(s.public, "upgrade").start()
        try:
            load.wait_confirmed(200, 30)
            (directory / "next").symlink_to(new)
            os.replace(directory / "next", installed)  # the new release installed in place
            first = primary()
            steps = [load.step(lambda: upgrade(name)) for name in [n for n in BROKERS if n != first] + [first]]
            after = {version(name) for name in BROKERS}
            if features:
                enable(s, addresses[primary()], list(features))
                for name in BROKERS:
                    wait_for(lambda: features_enabled(directory / "cluster" / name) == list(features), 10,
                             message=f"{name} keeping {', '.join(features)} enabled")
            # the yardstick: the outage a kill -9 of the primary costs the same clients
            failover = load.step(lambda: kill(primary())) if kill_primary else None
            load.drain()
        finally:
            load.stop()
        return Outcome(before, after, load.assert_at_least_once(), steps, failover)
    finally:
        s.close()
        if logs:
            _print_logs(s)


def enable(s: Supervised, primary: str, features: list[str]) -> None:
    """`haqueue admin cluster features enable` of each, at the primary, as the HA peer user (cluster up's only one)."""
    enable_new_features(lambda *args: run_haqueue(["admin", "-b", primary, "--user", HA_USER, "--password",
                                                   s.password(), *args]), features)


def _print_logs(s: Supervised) -> None:
    for name in BROKERS:
        log = s.directory / f"{name}.log"
        if log.exists():
            print(f"==== {name} ====\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    print("==== supervisor stderr ====\n" + s.stderr())
