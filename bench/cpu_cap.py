"""A share of one core for a process and every process it starts: a cgroup with a CPU quota (v1's cpu
controller, or v2's cpu.max), made by root. What lets a 2-core machine stand for a cluster whose worker
machines do not share their cores with the driver (bench/audit_scale.py --worker-cpu)."""
from __future__ import annotations

import os
from pathlib import Path

PERIOD_US = 100_000
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")


class CpuCap:
    """A cgroup named `name` whose processes together get `cores` of one core (0 < cores); `prefix` starts a
    command in it. remove() once its processes have ended."""

    def __init__(self, name: str, cores: float) -> None:
        if not 0 < cores:
            raise ValueError(f"a CPU cap must be above 0 cores, not {cores}")
        quota = int(cores * PERIOD_US)
        if (_V1 / "cpu.cfs_quota_us").exists():
            self.path = _V1 / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        elif (_V2 / "cgroup.controllers").exists():
            self.path = _V2 / name
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            raise RuntimeError("no cgroup CPU controller to cap a process with (/sys/fs/cgroup/cpu or cgroup v2)")

    def prefix(self) -> list[str]:
        """A command's prefix that moves its shell into the cgroup, then runs the command (the rest of argv)."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "cpu-capped"]

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # a process still in it (killed but not yet reaped): the name is unique to this run
