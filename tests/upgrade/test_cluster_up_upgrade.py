"""A rolling upgrade of a `haqueue cluster up` cluster, as README's procedure does it: the new release installed
where the old one was (here a symlink re-pointed, as an install replaces the files), then each broker stopped in
turn, backups first, and the supervisor (the previous release's, still running) restarts it from the new files;
the primary last, when the supervisor fails over to an upgraded backup. Under load, nothing confirmed is lost."""
from __future__ import annotations

import os
import signal
import time

from ha_harness import Load, wait_for
from harness import REPO_ROOT
from test_ha_supervisor import Supervised


def test_cluster_up_rolling_upgrade_under_load(tmp_path, previous):
    installed = tmp_path / "installed"  # what the brokers run: the previous release, then this build
    installed.symlink_to(previous.tree)
    (tmp_path / "cluster").mkdir()
    s = Supervised(tmp_path / "cluster", 3, code=installed)
    try:
        s.read_until("public ", 60)
        addresses = {f"broker-{i}": f"127.0.0.1:{s.base + i}" for i in range(3)}

        def version(name: str) -> str | None:
            try:
                with s.admin(addresses[name]) as a:
                    return a.request("READ", "broker")[2]["version"]
            except Exception:  # noqa: BLE001 - restarting
                return None

        def role(name: str) -> tuple[str, str] | None:
            status = s.status(addresses[name])
            return (status["role"], status["state"]) if status else None

        assert {version(name) for name in addresses} == {previous.version}
        wait_for(lambda: sorted(role(n) for n in addresses) == [("backup", "ready")] * 2 + [("primary", "active")],
                 30, message="a primary and two ready backups")
        load = Load(s.public, "upgrade").start()
        outages = []
        try:
            load.wait_confirmed(200, 30)
            (tmp_path / "next").symlink_to(REPO_ROOT)
            os.replace(tmp_path / "next", installed)  # the new release installed in place
            primary = next(n for n in addresses if role(n) == ("primary", "active"))
            for name in [n for n in addresses if n != primary] + [primary]:
                began = time.monotonic()
                os.kill(s.broker_pid(name), signal.SIGTERM)
                wait_for(lambda: version(name) not in (None, previous.version), 60,
                         message=f"{name} restarted by the supervisor on the new release")
                wait_for(lambda: role(name) == ("backup", "ready"), 60, message=f"{name} a ready backup again")
                load.wait_confirmed(200, 30)
                outages.append(load.outage_after(began))
            upgraded = {version(n) for n in addresses}
            assert previous.version not in upgraded and None not in upgraded, upgraded
            load.stop_producer()
            wait_for(lambda: set(load.confirmed) <= set(load.received), 30,
                     message=f"every confirmed message received ({load.report()})")
        finally:
            load.stop()
        report = load.report()
        print("cluster up rolling upgrade:", report, "client outage per step (s):", outages)
        assert report["lost"] == [], report
        assert len(report["duplicates"]) <= len(load.error_times) + 20, report  # what was in flight
    finally:
        s.close()
        for name in ("broker-0", "broker-1", "broker-2"):
            log = s.directory / f"{name}.log"
            if log.exists():
                print(f"==== {name} ====\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        print("==== supervisor stderr ====\n" + s.stderr())
