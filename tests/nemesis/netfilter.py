"""Network partitions with iptables inside a node's network namespace (iptables-nft).

Every rule goes into a chain of our own, `HQNM`, jumped to from INPUT and OUTPUT, so healing is one
flush and nothing else in the namespace is touched; deleting the namespace deletes the chain too.
Cutting node A from peer P drops A's packets to P and P's packets to A *inside A only*: the root
namespace (where the clients run) still reaches A, which is the partition of issue 27 ("cut from its
peers, not from its clients").
"""
from __future__ import annotations

import shutil
import subprocess

CHAIN = "HQNM"


def available() -> str | None:
    """Why partitions cannot be made here, or None."""
    if shutil.which("iptables") is None:
        return "no iptables: apt-get install -y iptables (make setup installs it)"
    return None


def _ipt(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-w", "5", *args],
                          capture_output=True, text=True, timeout=15)
    if check and proc.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)} in {ns}: {proc.stderr.strip()}")
    return proc


def _ensure_chain(ns: str) -> None:
    if _ipt(ns, "-S", CHAIN, check=False).returncode == 0:
        return
    _ipt(ns, "-N", CHAIN)
    _ipt(ns, "-I", "INPUT", "-j", CHAIN)
    _ipt(ns, "-I", "OUTPUT", "-j", CHAIN)


def cut(ns: str, peers: list[str]) -> None:
    """Drop every packet between the namespace and each peer address (both directions, inside ns)."""
    _ensure_chain(ns)
    for ip in peers:
        _ipt(ns, "-A", CHAIN, "-s", ip, "-j", "DROP")
        _ipt(ns, "-A", CHAIN, "-d", ip, "-j", "DROP")


def heal(ns: str) -> None:
    """Remove every rule this module added in the namespace (safe if there are none, or no namespace)."""
    if _ipt(ns, "-S", CHAIN, check=False).returncode == 0:
        _ipt(ns, "-F", CHAIN, check=False)


def rules(ns: str) -> list[str]:
    """The DROP rules in force in the namespace (for reports and leak checks)."""
    proc = _ipt(ns, "-S", CHAIN, check=False)
    return [line for line in proc.stdout.splitlines() if "-j DROP" in line] if proc.returncode == 0 else []
