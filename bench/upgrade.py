#!/usr/bin/env python3
"""A rolling upgrade under load, from one release to another (issue 46, design/upgrades.md):

    .venv/bin/python bench/upgrade.py --from 98be276 [--to REV] [--coordinator cluster] [--rounds N]

`--from` and `--to` name commits of this repository (`--to` defaults to this checkout's tree as it is), each
built as the tests build the previous release (tests/releases.py: `git archive`, compiled, cached under
build/releases/). `--coordinator cluster` upgrades a 3-broker `haqueue cluster up` cluster as README's
procedure does (tests/upgrade/rolling.py): a producer and a consumer through the public address, each broker
stopped in turn and restarted by the supervisor from the new release, the primary last; then, as a yardstick,
a kill -9 of the upgraded primary, its outage measured the same way. Each round ends with one line:

    upgrade: from X to Y, confirmed N, lost L, duplicates D, max client outage S s per step

and exit status 1 if a confirmed message was lost or a broker did not end on the new release.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "upgrade"), str(REPO / "tests"), str(REPO / "tests" / "ha"), str(REPO)]

import rolling  # noqa: E402
from releases import Release  # noqa: E402


def release(rev: str) -> Release:
    """The release at commit `rev`, built; its version read from its tree."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", f"{rev}^{{commit}}"], capture_output=True,
                            text=True, check=True).stdout.strip()
    built = Release("?", commit).build()
    namespace: dict[str, str] = {}
    for line in (built / "haqueue" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            exec(line.split("#")[0], namespace)  # noqa: S102 - one assignment of a string, from our own tree
    return Release(namespace.get("__version__", "?"), commit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, metavar="REV", help="the release upgraded from")
    parser.add_argument("--to", metavar="REV", help="the release upgraded to (default: this checkout)")
    parser.add_argument("--coordinator", choices=("cluster",), default="cluster",
                        help="who restarts the brokers: `cluster up`'s supervisor")
    parser.add_argument("--rounds", type=int, default=1, help="upgrades to run, each on a new cluster")
    args = parser.parse_args()
    old = release(args.source)
    new = release(args.to) if args.to else None
    target = new.tree if new else REPO
    to_name = f"{new.version} ({new.commit[:7]})" if new else "this checkout"
    failed = False
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="hq-upgrade-") as directory:
            outcome = rolling.cluster_up(Path(directory), old.tree, target, logs=False, kill_primary=True)
        report = outcome.report
        outage = max((o for o in outcome.outages if o is not None), default=0.0)
        print(f"upgrade: from {old.version} ({old.commit[:7]}) to {to_name}, confirmed {report['confirmed']}, "
              f"lost {len(report['lost'])}, duplicates {len(report['duplicates'])}, max client outage "
              f"{outage:.2f} s per step (steps: {', '.join(f'{o:.2f}' for o in outcome.outages if o is not None)}; "
              f"a kill -9 failover of the upgraded cluster: {outcome.failover or 0:.2f} s; "
              f"releases after: {', '.join(sorted(str(v) for v in outcome.after))})", flush=True)
        failed |= bool(report["lost"]) or old.version in outcome.after or None in outcome.after
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
