#!/usr/bin/env python3
"""A rolling upgrade under load, from one release to another (issue 46, design/upgrades.md):

    .venv/bin/python bench/upgrade.py --from 98be276 [--to REV] [--coordinator cluster] [--rounds N]
    sudo .venv/bin/python bench/upgrade.py --from v0.1.0 --coordinator pacemaker   (or zookeeper)

`--from` and `--to` name commits of this repository (`--to`: this checkout's tree as it is by default), built
as the tests build the previous release (tests/releases.py: `git archive`, compiled, under build/releases/).
`cluster` upgrades a 3-broker `haqueue cluster up` cluster as README's procedure does (tests/upgrade/rolling.py):
a producer and a consumer through the public address, each broker stopped in turn and restarted by the
supervisor from the new release, the primary last; then, as a yardstick, a kill -9 of the upgraded primary,
measured the same way. `pacemaker` and `zookeeper` run their coordinator's upgrade test
(tests/pacemaker/test_pacemaker_upgrade.py, tests/zookeeper/test_zookeeper_upgrade.py) from `--from`. Each round
prints one line (a step's outage: the longest time no publish was confirmed):

    upgrade: from X to Y, confirmed N, lost L, duplicates D, max client outage S s per step

Exit status 1 if a confirmed message was lost, more were duplicated than were in flight, or a broker did not end
on the new release.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "upgrade"), str(REPO / "tests"), str(REPO / "tests" / "ha"), str(REPO)]

import rolling  # noqa: E402
from releases import FROM_ENV, Release, summary  # noqa: E402

from haqueue import __version__  # noqa: E402

# The test that runs the upgrade under each external coordinator, from the release FROM_ENV names.
TESTS = {"pacemaker": "tests/pacemaker/test_pacemaker_upgrade.py",
         "zookeeper": "tests/zookeeper/test_zookeeper_upgrade.py"}


def cluster_round(old: Release, new: Release | None) -> bool:
    """One upgrade of `cluster up`; False if a broker did not end on the new release (a loss fails the run)."""
    with tempfile.TemporaryDirectory(prefix="hq-upgrade-") as directory:
        outcome = rolling.cluster_up(Path(directory), old.build(), new.build() if new else REPO, logs=False,
                                     kill_primary=True)
    target = f"{new.version} ({new.commit[:7]})" if new else f"{__version__} (this checkout)"
    print(summary(f"{old.version} ({old.commit[:7]})", target, outcome.report, outcome.steps)
          + f" (steps: {', '.join(str(step['stall']) for step in outcome.steps)}; a kill -9 failover of the "
            f"upgraded cluster: {outcome.failover['stall'] if outcome.failover else '-'} s)", flush=True)
    return old.version not in outcome.after and None not in outcome.after


def coordinated_round(old: Release, coordinator: str) -> bool:
    """One upgrade under Pacemaker or ZooKeeper, as its test runs it; its summary line printed."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TESTS[coordinator]],
                         cwd=REPO, env={**os.environ, FROM_ENV: old.commit}, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith("upgrade: ")]
    for line in lines:
        print(f"{line} ({coordinator})", flush=True)
    if run.returncode != 0 or not lines:
        print(run.stdout[-3000:], run.stderr[-2000:], sep="\n", file=sys.stderr)
    return run.returncode == 0 and bool(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, metavar="REV", help="the release upgraded from")
    parser.add_argument("--to", metavar="REV", help="the release upgraded to (default: this checkout; `cluster` only)")
    parser.add_argument("--coordinator", choices=("cluster", *TESTS), default="cluster",
                        help="who runs the brokers: `cluster up`'s supervisor (default), Pacemaker or ZooKeeper")
    parser.add_argument("--rounds", type=int, default=1, help="upgrades to run, each on a new cluster")
    args = parser.parse_args()
    if args.to and args.coordinator != "cluster":
        parser.error("--to goes with --coordinator cluster: the Pacemaker and ZooKeeper tests upgrade to this checkout")
    old = Release.at(args.source)
    new = Release.at(args.to) if args.to else None
    ok = all([cluster_round(old, new) if args.coordinator == "cluster" else coordinated_round(old, args.coordinator)
              for _ in range(args.rounds)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
