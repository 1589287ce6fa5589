"""A rolling upgrade of a `haqueue cluster up` cluster under load, as README's procedure does it, for the tests
and bench/upgrade.py: the old release installed (a symlink to its tree), the cluster started on it, a producer
and a consumer running; then the new release installed where the old one was (the symlink re-pointed, as an
install replaces the files) and each broker stopped in turn, backups first, the supervisor (the old release's,
still running) restarting it from the new files; the primary last, when the supervisor fails over to an
upgraded backup. Each step waits until the broker is a ready backup of the new release and 200 more publishes
are confirmed."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ha_harness import Load, wait_for
from test_ha_supervisor import Supervised

BROKERS = ("broker-0", "broker-1", "broker-2")


@dataclass
class Outcome:
    before: set[str | None]  # the releases the brokers ran before, as their status said
    after: set[str | None]  # and after
    report: dict[str, Any]  # the load's (ha_harness.Load.report)
    outages: list[float | None]  # the clients' outage in each step, seconds (Load.outage_after)
    send_failures: int  # publishes that failed and were sent again: each may be held twice
    failover: float | None  # the clients' outage when the upgraded primary was then killed (kill_primary)


def cluster_up(directory: Path, old: Path, new: Path, logs: bool = True, kill_primary: bool = False) -> Outcome:
    """Upgrade a 3-broker `cluster up` cluster, run from `old` (a haqueue tree), to `new`, under load; with
    `kill_primary`, then kill -9 its primary to measure a failover's outage alike; with `logs`, print the tails of
    the brokers' logs at the end (pytest shows them with a failure)."""
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

        wait_for(lambda: sorted(role(n) for n in BROKERS) == [("backup", "ready")] * 2 + [("primary", "active")],
                 30, message="a primary and two ready backups")
        before = {version(name) for name in BROKERS}
        load = Load(s.public, "upgrade").start()
        outages = []
        try:
            load.wait_confirmed(200, 30)
            (directory / "next").symlink_to(new)
            os.replace(directory / "next", installed)  # the new release installed in place
            primary = next(n for n in BROKERS if role(n) == ("primary", "active"))
            for name in [n for n in BROKERS if n != primary] + [primary]:
                began = time.monotonic()
                old_version = version(name)
                os.kill(s.broker_pid(name), signal.SIGTERM)
                wait_for(lambda: version(name) not in (None, old_version), 60,
                         message=f"{name} restarted by the supervisor on the new release")
                wait_for(lambda: role(name) == ("backup", "ready"), 60, message=f"{name} a ready backup again")
                load.wait_confirmed(200, 30)
                outages.append(load.outage_after(began))
            after = {version(name) for name in BROKERS}
            failover = None
            if kill_primary:  # the yardstick: the outage a kill -9 of the primary costs the same clients
                primary = next(n for n in BROKERS if role(n) == ("primary", "active"))
                began = time.monotonic()
                os.kill(s.broker_pid(primary), signal.SIGKILL)
                wait_for(lambda: role(primary) == ("backup", "ready"), 60, message=f"{primary} back after its kill")
                load.wait_confirmed(200, 30)
                failover = load.outage_after(began)
            load.stop_producer()
            wait_for(lambda: set(load.confirmed) <= set(load.received), 30,
                     message=f"every confirmed message received ({load.report()})")
        finally:
            load.stop()
        return Outcome(before, after, load.report(), outages, len(load.error_times), failover)
    finally:
        s.close()
        if logs:
            _print_logs(s)


def _print_logs(s: Supervised) -> None:
    for name in BROKERS:
        log = s.directory / f"{name}.log"
        if log.exists():
            print(f"==== {name} ====\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    print("==== supervisor stderr ====\n" + s.stderr())
