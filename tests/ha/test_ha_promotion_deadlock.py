"""A primary lost while its backups are still catching up: no backup is ready, and the old primary, back
with the freshest store, is the one that can be promoted. It used to be refused for good ("catchup
followed a primary since it started"), and the cluster had no primary until a whole restart."""
from __future__ import annotations

from ha_harness import receive, send_all
from harness import wait_for

HOLD = "HAQUEUE_TEST_HOLD_CAUGHT_UP"  # haqueue/ha/test_hooks.py: the primary never lets a backup catch up on it


def test_the_old_primary_with_the_freshest_store_is_promoted_when_no_backup_is_ready(ha_cluster):
    c = ha_cluster()
    c[0].env = {HOLD: "stuck"}
    c.start(0)
    c.promote(c[0])
    send_all(c.public, "stuck", ["held"])  # a backup joining later has it to catch up: never told it has
    c.start(1, 2)
    for b in (c[1], c[2]):
        c.wait_state(b, "backup", "catchup", check=lambda s: s.get("primary") == "b0")
    send_all(c.public, "q", range(50))  # confirmed by both backups: "q" itself is caught up
    c.kill(c[0])
    c[0].env = {}
    c.start(0)

    def status_of(b):
        return c.try_status(b) or {}
    # a catching-up backup is refused, and says why and what overrides it
    refusal = wait_for(lambda: status_of(c[1]).get("promotion_refused"), 15, message="b1's promotion refusal")
    assert "--force" in refusal, refusal
    promoted = wait_for(lambda: c.cli(c[0], "ha", "promote").returncode == 0, 20, message="b0 promoted again")
    assert promoted
    for b in (c[1], c[2]):
        c.wait_ready(b, queues=["q", "stuck"])
    for b in c:
        assert c.bodies(b, "q") == list(range(50)), b.name
        assert c.bodies(b, "stuck") == ["held"], b.name
    assert [m.body for m in receive(c.public, "q", 50)] == list(range(50))
