"""The supervisor's judgement of a primary that leaves its pings unanswered, and of a starting broker that does not
answer yet: busy (using CPU) or hung (stopped, or idle without answering). Real child processes; their CPU read from /proc as the supervisor reads it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness import free_port, wait_for
from haqueue.admin import AdminError
from haqueue.coord import supervisor
from haqueue.coord.liveness import Liveness, cpu_seconds


@pytest.fixture
def spawn():
    children: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        children.append(child)
        assert child.stdout.readline() == "started\n"  # its interpreter's start-up is over
        return child
    yield start
    for child in children:
        child.kill()
        child.wait()


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_process_using_cpu_is_busy(spawn):
    child = spawn("print('started', flush=True)\nwhile True: pass")
    liveness = Liveness(child.pid, "spinner")
    start = liveness.cpu
    wait_for(lambda: cpu_seconds(child.pid) > start, 10, message="the spinner using CPU")
    assert liveness.busy()


def test_a_stopped_process_is_hung(spawn):
    child = spawn("print('started', flush=True)\nwhile True: pass")
    liveness = Liveness(child.pid, "stopped")
    os.kill(child.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: state(child.pid) == "T", 10, message="the child stopped")
        assert not liveness.busy()
    finally:
        os.kill(child.pid, signal.SIGCONT)


def test_an_idle_process_that_does_not_answer_is_hung(spawn):
    child = spawn("import time\nprint('started', flush=True)\ntime.sleep(60)")
    wait_for(lambda: state(child.pid) == "S", 10, message="the child asleep")
    liveness = Liveness(child.pid, "idle")
    assert not liveness.busy()


@pytest.mark.parametrize("code, why", [
    ("while True: pass", r"did not answer within \d+ s; see"),  # working, but past START_TIMEOUT
    ("import time\ntime.sleep(60)", "using no CPU for 0.3 s"),  # idle: hung
])
def test_a_starting_broker_that_never_answers_is_given_up_on_saying_why(spawn, monkeypatch, tmp_path, code, why):
    """The supervisor waits for a starting broker while it uses CPU (a store's recovery), not while it idles."""
    monkeypatch.setattr(supervisor, "START_GRACE", 0.3)
    monkeypatch.setattr(supervisor, "START_TIMEOUT", 1.0)
    member = supervisor.Member("b0", ("127.0.0.1", free_port()), [], str(tmp_path / "b0.log"))
    member.process = spawn(f"print('started', flush=True)\n{code}")
    with pytest.raises(AdminError, match=why):
        supervisor.Supervisor([member], "ha", "secret").wait_answering(member)
