"""Earlier releases of haqueue, built from this repository's git history, to run beside this build: mixed-version
clusters and rolling upgrades (design/upgrades.md). The tests and bench/upgrade.py share one build per release.

A release is the tree of its commit (`git archive`), compiled as `make build` compiles this one (the C extensions
and the mypyc hot path, with this virtualenv's python and mypy: the releases pin the same dependencies), under
build/releases/<commit>/ in this checkout. A broker runs it with that tree first on its PYTHONPATH
(`Release.env`). Building takes a few minutes once; workers that ask at the same time wait for one build.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from harness import BrokerProcess

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILDS = REPO_ROOT / "build" / "releases"
BUILD_TIMEOUT = 900.0


@dataclass(frozen=True)
class Release:
    version: str
    commit: str  # the full hash: a release is pinned by its commit, which every clone of main has

    @property
    def tree(self) -> Path:
        return BUILDS / self.commit

    @classmethod
    def at(cls, rev: str) -> "Release":
        """The release at commit `rev` of this repository, its version as its haqueue/__init__.py says."""
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                                  check=True).stdout
        commit = git("rev-parse", f"{rev}^{{commit}}").strip()
        version = next((line.split('"')[1] for line in git("show", f"{commit}:haqueue/__init__.py").splitlines()
                        if line.startswith("__version__")), "?")
        return cls(version, commit)

    def env(self) -> dict[str, str]:
        """What a broker process (harness.BrokerProcess's `env`) needs to run this release."""
        return {"PYTHONPATH": str(self.tree)}

    def run(self, b: BrokerProcess) -> None:
        """From its next start, `b` runs this release, on the same config and data directory."""
        b.env = self.env()

    def command(self, *args: str) -> list[str]:
        """`haqueue ARGS` of this release."""
        return [sys.executable, "-m", "haqueue", *args]

    def build_soon(self) -> None:
        """Start building in a process of its own unless built already: from the start of a test run, so the
        tests that need the release, on any worker, wait less for it (build() waits for that build)."""
        if not (self.tree / ".built").exists():
            subprocess.Popen([sys.executable, __file__, self.commit], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def build(self) -> Path:
        """The release's compiled tree, built now unless it is there already."""
        BUILDS.mkdir(parents=True, exist_ok=True)
        done = self.tree / ".built"
        if done.exists():
            return self.tree
        with open(BUILDS / f"{self.commit}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building it: wait, then use its build
            if not done.exists():
                self._build()
        return self.tree

    def _build(self) -> None:
        started = time.monotonic()
        staging = BUILDS / f"{self.commit}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(self.tree, ignore_errors=True)
        staging.mkdir()
        try:
            archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", self.commit],
                                     capture_output=True, check=True).stdout
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"release {self.version}: commit {self.commit} is not in this clone's history "
                               f"({e.stderr.decode().strip()}); the upgrade tests need the full history "
                               f"(git fetch --unshallow)") from e
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)
        # The console's charting library comes from npm at `make setup`, not git: this build's copy serves.
        vendor = REPO_ROOT / "haqueue" / "console" / "static" / "vendor"
        if vendor.is_dir():
            shutil.copytree(vendor, staging / "haqueue" / "console" / "static" / "vendor", dirs_exist_ok=True)
        built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=staging,
                               capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if built.returncode != 0:
            raise RuntimeError(f"release {self.version} ({self.commit}) did not build:\n{built.stderr[-4000:]}")
        # As `make build` does: the compiled group newer than every source, so the release runs compiled.
        now = time.time()
        for library in (staging / "haqueue").glob("_hot_path__mypyc*.so"):
            os.utime(library, (now, now))
        staging.rename(self.tree)
        (self.tree / ".built").write_text(f"built in {time.monotonic() - started:.0f} s\n")


# The first numbered release: main at the end of 2026-11-28, before versions and the negotiated peer protocol.
V0_1_0 = Release("0.1.0", "98be276c1ea263f8d68960aa4c857c3d4f7abcc4")
FROM_ENV = "HAQUEUE_UPGRADE_FROM"  # a commit to upgrade from instead (bench/upgrade.py --from)
# The release this build upgrades from, in the upgrade tests.
PREVIOUS = Release.at(os.environ[FROM_ENV]) if os.environ.get(FROM_ENV) else V0_1_0


def summary(source: str, target: str, report: dict[str, Any], steps: Iterable[dict[str, Any]]) -> str:
    """The one line an upgrade under load ends with (bench/upgrade.py): a step's outage is the longest time the
    producer had no publish confirmed (harness Load.step's `stall`)."""
    worst = max((step["stall"] for step in steps), default=0.0)
    return f"upgrade: from {source} to {target}, confirmed {report['confirmed']}, lost {len(report['lost'])}, " \
           f"duplicates {len(report['duplicates'])}, max client outage {worst:.2f} s per step"


if __name__ == "__main__":  # build_soon's process: the release at the commit given; `make test`: PREVIOUS
    (Release("?", sys.argv[1]) if len(sys.argv) > 1 else PREVIOUS).build()
