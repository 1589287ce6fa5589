"""A node's store on its own small ext4 file system (a loop-mounted file), so a nemesis can fill it
(disk full) or slow it down (blkio throttling of the loop device, per broker process).

Slow disk: cgroup v1's blkio controller limits the write IOPS a cgroup may submit to one block
device; a broker moved into such a cgroup waits ~1/IOPS s on every journal `fdatasync` (measured:
5 IOPS -> 0.21 s per 4 KB append + fdatasync), which is what a saturated or failing disk looks like
from the broker, without touching haqueue. dm-delay would do the same per device but this kernel has
no device mapper.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")
CGROUP_PREFIX = "hqnm-slow-"
FILLER = "nemesis-filler"


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def loop_available() -> str | None:
    if not os.path.exists("/dev/loop-control") or shutil.which("mkfs.ext4") is None:
        return "no loop devices or mkfs.ext4"
    return None


def mount_store(image: Path, mount_point: Path, size_mb: int) -> None:
    """Make `mount_point` a fresh ext4 of `size_mb` MB (no reserved blocks: the broker runs as root)."""
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    _run("mkfs.ext4", "-q", "-m", "0", str(image))
    mount_point.mkdir(parents=True, exist_ok=True)
    _run("mount", "-o", "loop", str(image), str(mount_point))


def unmount(mount_point: Path) -> None:
    """Lazily: a node's mount namespace may still hold it; the loop device is freed with the last user."""
    _run("umount", "-l", str(mount_point), check=False)


def leftover_mounts(marker: str) -> list[str]:
    """Mount points whose path contains `marker` (an earlier run's that died)."""
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if marker in line.split()[1]]


def fill(mount_point: Path) -> int:
    """Fill the file system to the last block (1 MB writes, then 4 KB ones); returns the bytes written."""
    fd = os.open(mount_point / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    written = 0
    try:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):
            while True:
                try:
                    n = os.write(fd, chunk)
                except OSError:  # ENOSPC: full at this size, try smaller
                    break
                written += n
                if n < len(chunk):
                    break
        try:
            os.fsync(fd)
        except OSError:
            pass
    finally:
        os.close(fd)
    return written


def unfill(mount_point: Path) -> None:
    try:
        (mount_point / FILLER).unlink()
    except FileNotFoundError:
        pass


def device_of(mount_point: Path) -> str:
    """MAJOR:MINOR of the block device mounted there."""
    st = os.stat(mount_point)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def blkio_available() -> str | None:
    return None if (BLKIO / "blkio.throttle.write_iops_device").exists() else "no cgroup v1 blkio throttling"


def throttle(name: str, pid: int, device: str, write_iops: int) -> None:
    """Move process `pid` (every thread) into a blkio cgroup limited to `write_iops` on `device`."""
    group = BLKIO / f"{CGROUP_PREFIX}{name}"
    group.mkdir(exist_ok=True)
    (group / "blkio.throttle.write_iops_device").write_text(f"{device} {write_iops}\n")
    (group / "cgroup.procs").write_text(str(pid))


def unthrottle(name: str) -> None:
    """Every process of the group back to the root group, then the group removed."""
    group = BLKIO / f"{CGROUP_PREFIX}{name}"
    if not group.exists():
        return
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            (BLKIO / "cgroup.procs").write_text(pid)
        except OSError:  # exited meanwhile
            pass
    try:
        group.rmdir()
    except OSError:
        pass


def unthrottle_all() -> None:
    for group in BLKIO.glob(f"{CGROUP_PREFIX}*"):
        unthrottle(group.name[len(CGROUP_PREFIX):])
