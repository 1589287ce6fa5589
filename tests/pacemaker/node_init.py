"""The init of one test cluster node: starts corosync, then pacemakerd, and reaps every orphan.

Run by the node's boot script (inside the node's namespaces) as `python3 node_init.py NODE_DIR`.
It makes itself a child subreaper, so processes that lose their parent inside the node (the
brokers the OCF agent starts, Pacemaker's daemons if the test kills them) are reaped here rather
than by the machine's PID 1 (which in a container may never reap them). It exits when it has no
child left, that is after `pacemakerd --shutdown` and `corosync-cfgtool -H` (or a kill).
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(node_dir: str) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    with open(os.path.join(node_dir, "corosync.out"), "ab") as out:
        subprocess.Popen(["corosync", "-f"], stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 10
    while subprocess.run(["corosync-cfgtool", "-s"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            print("corosync did not start within 10 s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    env = {**os.environ, "PCMK_logfile": "/var/log/pacemaker/pacemaker.log"}
    with open(os.path.join(node_dir, "pacemakerd.out"), "ab") as out:
        subprocess.Popen(["pacemakerd"], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    print("node up", flush=True)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
