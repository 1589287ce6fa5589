"""The mirror's first step (design/mirroring.md): a 2-broker source cluster mirrors chosen queues to a standby broker
50 ms away (tests/mirror/delay_relay.py). What a user sees: after the lag drains the standby holds exactly the
messages the source still holds, in the source's order, consumption included; unmirrored queues are not there; a
cut and a heal of the site link lose nothing; clients cannot publish to or consume from a mirror; a bad `mirror:`
section is refused naming the key.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import LinkDetached

from mirror_harness import MAX_BACKLOG_BYTES, MIRROR_PASSWORD, MIRROR_USER, Side, Sites, accept_back
from ha_harness import browse, connect, receive, send_all
from harness import run_haqueue, wait_for

from haqueue.admin import AdminClient
from haqueue.config import ConfigError, broker_config
from haqueue.ha.quarantine import diverged_files, read_messages

MIRRORED = ["orders.0", "orders.1", "orders.2"]
LAG_TIMEOUT = 30.0


def mirror_status(address: str, user: str | None = None, password: str | None = None) -> dict[str, Any]:
    with AdminClient(address, 5.0, user, password) as client:
        code, description, answer = client.request("READ", "mirror")
    assert code == 200, description
    return answer


def drained(site: Sites) -> dict[str, Any] | None:
    """The source primary's mirror status once every mirrored queue is mirroring with nothing held back."""
    return mirroring_only(site, MIRRORED)


def named(queue: str, body: int) -> str:
    """A message's name in the ledger: its queue and body (a number, per queue, in the order published)."""
    return f"{queue}-{body}"


def publish(site: Sites, queue: str, first: int, n: int) -> None:
    ids = [named(queue, i) for i in range(first, first + n)]
    send_all(site.source.public, queue, [Message(id=i, body=int(i.rsplit("-", 1)[1]), durable=True) for i in ids])
    site.ledger.confirmed.setdefault(queue, []).extend(ids)  # send_all returns once every one is confirmed


def under_load(work: list[tuple[Any, ...]]) -> None:
    """Each (function, args...) at once, in threads; every one must finish."""
    errors: list[BaseException] = []

    def run(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=item) for item in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads), errors


def consume(site: Sites, queue: str, n: int) -> None:
    site.ledger.consumed.setdefault(queue, set()).update(m.id for m in receive(site.source.public, queue, n))


def assert_same(site: Sites) -> None:
    """The standby holds what the clients' ledger says the source holds, queue by queue, in the same order (and so
    does the source), each with its source seq."""
    for queue in MIRRORED:
        expected = site.ledger.remaining(queue)
        assert [named(queue, m.body) for m in site.source.browse(site.primary, queue)] == expected, queue
        there = browse(site.standby.address, queue, len(expected)) if expected else []
        assert [named(queue, m.body) for m in there] == expected, queue
        seqs = [m.annotations["x-opt-mirror-seq"] for m in there]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), queue
    standby_queues = {q["queue"]: q for q in mirror_status(site.standby.address)["standby"]["queues"]}
    assert {name: q["messages"] for name, q in standby_queues.items()} == {
        queue: len(site.ledger.remaining(queue)) for queue in MIRRORED}


def test_mirror_under_load_through_a_cut_then_the_site_lost(sites) -> None:
    site = sites(queues=["orders.*"])
    # publishers on three mirrored queues and an unmirrored one, a consumer on two of them, all at once
    under_load([(publish, site, q, 0, 400) for q in MIRRORED] + [(publish, site, "local.q", 0, 200)]
               + [(consume, site, "orders.0", 150), (consume, site, "orders.1", 60)])
    wait_for(lambda: drained(site), LAG_TIMEOUT, message="the mirror's lag drains")
    shown = site.source.cli(site.primary, "mirror", "status")  # what an operator types
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["source"]["protocol"] == 2  # a pass's messages in one transfer (B)
    queues = {q["queue"]: q for q in json.loads(shown.stdout)["source"]["queues"]}
    assert sorted(queues) == MIRRORED and all(q["last_mirrored_seq"] > 0 and q["lag_seconds"] == 0.0
                                              for q in queues.values()), queues
    assert_same(site)
    assert "local.q" not in {q["queue"] for q in mirror_status(site.standby.address)["standby"]["queues"]}
    accepted = site.relay.accepted

    # the site link cut: the source goes on serving; what it does meanwhile reaches the standby after the heal
    site.relay.cut()
    under_load([(publish, site, q, 400, 100) for q in MIRRORED] + [(consume, site, "orders.1", 120),
                                                                    (consume, site, "orders.2", 30)])
    cut = source_status(site)
    assert not cut["connected"] and cut["down"]
    lagging = {q["queue"]: q for q in cut["queues"]}
    assert lagging["orders.0"]["lag_messages"] == 100 and lagging["orders.0"]["lag_seconds"] > 0, lagging
    assert lagging["orders.0"]["bytes_held_back"] > MAX_BACKLOG_BYTES and lagging["orders.0"]["backlog_limit_reached"]
    assert "mirror of queue orders.0: " in site.primary.log() and "over mirror.max_backlog_bytes" in site.primary.log()
    site.relay.heal()
    status = wait_for(lambda: drained(site), LAG_TIMEOUT, message="the mirror's lag drains after the heal")
    assert not any(q["backlog_limit_reached"] for q in status["queues"]), status
    assert "back under mirror.max_backlog_bytes" in site.primary.log()
    assert site.relay.accepted > accepted
    assert_same(site)

    # the source's site lost: the link cut, more published and consumed there, its brokers killed. The standby,
    # promoted (no --force needed: its source is gone), serves what was mirrored: what the source consumed since
    # is redelivered, and nothing else; what it confirmed since is what the site's loss cost (the recovery point)
    mirrored = {q: site.ledger.remaining(q) for q in MIRRORED}
    consumed = {q: set(site.ledger.consumed.get(q, ())) for q in MIRRORED}
    site.relay.cut()
    under_load([(publish, site, q, 500, 20) for q in MIRRORED] + [(consume, site, "orders.0", 25)])
    for broker in site.source:
        site.source.kill(broker)
    promoted = promote(site)
    assert promoted.returncode == 0, promoted.stderr
    for queue in MIRRORED:
        resumed = [m.id for m in receive(site.standby.address, queue, len(mirrored[queue]))]
        assert resumed == mirrored[queue], queue
        redelivered = set(resumed) & site.ledger.consumed.get(queue, set())
        assert redelivered == site.ledger.consumed.get(queue, set()) - consumed[queue], queue
        lost = [i for i in site.ledger.remaining(queue) if i not in resumed]
        assert lost == [f"{queue}-{i}" for i in range(500, 520)], queue
    assert all(q["messages"] == 0 for q in mirror_status(site.standby.address)["standby"]["queues"])


def test_a_new_source_primary_resumes_the_mirror_under_load_then_the_site_lost(sites) -> None:
    """Ten mirrored queues under continuous load (a producer on each, a consumer on five), the site link 50 ms long.
    The link is cut (the standby falls behind, its transfers in flight lost), the source's primary killed (-9)
    mid-load and its backup promoted, the link healed: the new primary resumes the mirror from what the standby
    holds (the dequeues of the meantime included) while the clients go on. Then the consumers stop (their dequeues
    reach the standby) and the whole source is killed mid-publish. The standby, promoted, holds every message
    confirmed at the source up to the last one mirrored, less what the source's consumers took, in the order
    published, and nothing twice but a publish retried across the kill; consumers resume there and are given none
    of what they took."""
    site = sites(queues=["orders.*"], source_goes_on=True)
    queues = [f"orders.{i}" for i in range(10)]
    producers = {q: Side(site.source.public, q, producer=True).start() for q in queues}
    consumers = {q: Side(site.source.public, q, producer=False).start() for q in queues[:5]}
    try:
        def confirmed_and_mirrored(more: dict[str, int]) -> bool:
            """`more` confirmed on each queue, and this source primary's mirror confirmed by the standby on each."""
            return all(producers[q].confirmed_count() >= n for q, n in more.items()) and \
                mirrored_here(site, queues, frozenset(consumers))
        wait_for(lambda: confirmed_and_mirrored({q: 20 for q in queues}), LAG_TIMEOUT, message="mirrored under load")
        site.relay.cut()  # the standby falls behind: published and consumed meanwhile, its transfers cut off
        more = {q: p.confirmed_count() + 10 for q, p in producers.items()}
        wait_for(lambda: all(producers[q].confirmed_count() >= n for q, n in more.items()), LAG_TIMEOUT,
                 message="published while the site link is cut")
        site.source.kill(site.primary)
        site.primary = site.source[1]
        site.source.promote(site.primary)
        site.relay.heal()
        more = {q: p.confirmed_count() + 20 for q, p in producers.items()}
        wait_for(lambda: confirmed_and_mirrored(more), LAG_TIMEOUT,
                 message="the clients served and the mirror resumed by the new source primary")
        for consumer in consumers.values():
            consumer.stop()
        wait_for(lambda: all(head(site.source.request(site.primary, "PEEK", "queue", q, {"count": 1})) ==
                             head(standby_peek(site, q)) for q in consumers), LAG_TIMEOUT,
                 message="the consumers' dequeues applied on the standby")
        site.source.kill(site.primary)  # the whole source (its first primary is dead already), mid-publish
    finally:
        for side in [*producers.values(), *consumers.values()]:
            side.stop()
    promoted = promote(site, "--force")  # forced, not to wait for a source that is gone (the first test waits)
    assert promoted.returncode == 0, promoted.stderr
    held = {q["queue"]: q["messages"] for q in mirror_status(site.standby.address)["standby"]["queues"]}
    for queue in queues:
        got = [m.body for m in receive(site.standby.address, queue, held[queue])]
        producer = producers[queue]
        confirmed = list(producer.confirmed)  # in the order published: each was confirmed before the next was sent
        taken = set(consumers[queue].received) if queue in consumers else set()
        assert got == sorted(got) and set(got) - set(confirmed) <= {producer.next}, (queue, got)
        assert len(got) - len(set(got)) <= len(producer.error_times), (queue, got)  # a publish retried at the kill
        skipped = [b for b in confirmed if b <= max(got) and b not in got and b not in taken]
        assert not skipped and not set(got) & taken, (queue, skipped, set(got) & taken)
        lost = [b for b in confirmed if b > max(got) and b not in taken]  # confirmed, never mirrored: the RPO
        print(f"{queue}: {len(confirmed)} confirmed, {len(taken)} consumed at the source, {len(set(got))} on the "
              f"standby, {len(lost)} lost with the site")
    assert all(q["messages"] == 0 for q in mirror_status(site.standby.address)["standby"]["queues"])


def head(peeked: list[dict[str, Any]]) -> Any:
    """The body of the first message a PEEK answered, None if the queue is empty."""
    return _decoded(peeked[0]["message"]).body if peeked else None


def standby_peek(site: Sites, queue: str) -> list[dict[str, Any]]:
    with AdminClient(site.standby.address, 5.0) as admin:
        code, description, answer = admin.request("PEEK", "queue", queue, {"count": 1})
    assert code == 200, description
    return answer


def test_a_new_standby_primary_takes_the_mirror_over(sites) -> None:
    """The standby is a cluster of three; its primary is killed (-9) while the source's clients publish and consume,
    and a backup promoted: the new standby primary learns what it holds of each source queue from the messages
    themselves (though its mirror status was read while it was a backup, as a scrape does), keeps the queues
    read-only, and takes the mirror on: it ends holding exactly what the source holds, in order. Once the standby
    is promoted, its next primary holds the epoch too, and fences the source off."""
    site = sites(queues=["orders.*"], standby_size=3)
    cluster = site.standby_cluster
    assert cluster is not None
    producers = {q: Side(site.source.public, q, producer=True).start() for q in MIRRORED}
    consumer = Side(site.source.public, "orders.0", producer=False).start()
    try:
        wait_for(lambda: all(p.confirmed_count() >= 30 for p in producers.values()) and
                 mirrored_here(site, MIRRORED, frozenset({"orders.0"})), LAG_TIMEOUT, message="mirrored under load")
        for backup in cluster[1], cluster[2]:  # as a scrape of every broker would
            assert {q["queue"] for q in cluster.request(backup, "READ", "mirror")["standby"]["queues"]} == \
                set(MIRRORED)
        more = {q: p.confirmed_count() + 30 for q, p in producers.items()}
        wait_for(lambda: all(producers[q].confirmed_count() >= n for q, n in more.items()), LAG_TIMEOUT,
                 message="more published, replicated to the standby's backups")
        cluster.kill(site.standby)
        site.standby = cluster[1]
        cluster.promote(site.standby)
        more = {q: p.confirmed_count() + 30 for q, p in producers.items()}
        wait_for(lambda: all(producers[q].confirmed_count() >= n for q, n in more.items()), LAG_TIMEOUT,
                 message="more published after the standby's failover")
    finally:
        for side in [*producers.values(), consumer]:
            side.stop()
    for queue, producer in producers.items():  # the ledger: what each client was told
        assert not producer.error_times, producer.errors  # the source was not touched
        site.ledger.confirmed[queue] = [named(queue, b) for b in producer.confirmed]
    site.ledger.consumed["orders.0"] = {named("orders.0", b) for b in consumer.received}
    wait_for(lambda: drained(site), LAG_TIMEOUT, message="the mirror's lag drains at the new standby primary")
    assert_same(site)
    assert "read-only on this standby" in refusal(site.standby.address, "orders.2", sender=True)

    # promoted (forced: the source mirrors into it; answered once its backup holds the epoch), then failed over
    # again, to its other backup: the epoch is the standby cluster's
    assert promote(site, "--force").returncode == 0
    cluster.kill(site.standby)
    site.standby = cluster[2]
    cluster.promote(site.standby)
    status = mirror_status(site.standby.address)["standby"]
    assert (status["role"], status["epoch"]) == ("promoted", 2), status
    wait_for(lambda: refused(site, "fenced: this standby was promoted at mirror epoch 2"), LAG_TIMEOUT,
             message="the source fenced off by the new standby primary")
    send_all(site.standby.address, "orders.2", [Message(id="orders.2-standby", body=-1, durable=True)])


def mirrored_here(site: Sites, queues: list[str], consumed: frozenset[str] = frozenset()) -> bool:
    """The source primary mirrors exactly `queues`, and the standby confirmed a transfer of each from it but those
    `consumed` here: a consumer faster than the mirror's tick takes every message before it is read, so nothing of
    such a queue need ever be sent (only its state is asked)."""
    status = source_status(site)
    return status["connected"] and [q["queue"] for q in status["queues"]] == queues and all(
        q["state"] == "mirroring" and (q["last_mirrored_seq"] > 0 or q["queue"] in consumed)
        for q in status["queues"])


def test_mirror_over_tls(sites) -> None:
    """mirror.tls: the source reaches the standby's TLS listener with its certificate, trusting the standby's CA."""
    site = sites(queues=["orders.*"], tls=True)
    publish(site, "orders.0", 0, 20)
    wait_for(lambda: _drained_one(site, "orders.0"), LAG_TIMEOUT, message="orders.0 mirrored over TLS")
    assert [m.id for m in browse(site.standby.address, "orders.0", 20)] == site.ledger.remaining("orders.0")


def test_a_standby_of_mirror_protocol_1(sites) -> None:
    """A standby that speaks only mirror protocol 1 (the test hook: as one of the release before): the source sends
    each message alone, annotated (`E`), and the standby ends holding what the source holds, in order."""
    site = sites(queues=["orders.*"], standby_env={"HAQUEUE_TEST_MIRROR_PROTOCOLS": "1-1"})
    publish(site, "orders.0", 0, 30)
    consume(site, "orders.0", 10)
    status = wait_for(lambda: mirroring_only(site, ["orders.0"]), LAG_TIMEOUT, message="orders.0 mirrored")
    assert status["protocol"] == 1 and status["queues"][0]["messages_per_transfer"] == 1, status
    there = browse(site.standby.address, "orders.0", 20)
    assert [m.id for m in there] == site.ledger.remaining("orders.0")
    seqs = [m.annotations["x-opt-mirror-seq"] for m in there]
    assert seqs == sorted(seqs) and len(set(seqs)) == 20


def test_mirror_is_read_only_on_the_standby_until_promoted(sites) -> None:
    """Read-only whichever way a publish comes; `mirror promote` refused while the source mirrors, forced: then
    the queue is the standby's clients', and the source, fenced off by the epoch, says why it feeds it no more. The
    source's wiring into its mirrored queues is mirrored too: a promoted standby routes as the source did."""
    site = sites(queues=["orders.*"])
    site.source.request(site.primary, "CREATE", "exchange", "orders", {"type": "topic"})
    for queue, key in [("orders.0", "o.#"), ("orders.1", "p.#"), ("local.q", "o.#")]:
        site.source.request(site.primary, "CREATE", "queue", queue, {})
        site.source.request(site.primary, "CREATE", "binding", None, {"exchange": "orders", "queue": queue, "key": key})
    publish(site, "orders.0", 0, 10)
    wait_for(lambda: _drained_one(site, "orders.0"), LAG_TIMEOUT, message="orders.0 mirrored")
    wired = {("orders", "orders.0", "o.#"), ("orders", "orders.1", "p.#")}
    wait_for(lambda: standby_bindings(site) == wired, LAG_TIMEOUT, message="the wiring into orders.* mirrored")
    site.source.request(site.primary, "DELETE", "binding", None, {"exchange": "orders", "queue": "orders.1",
                                                                  "key": "p.#"})
    wait_for(lambda: standby_bindings(site) == wired - {("orders", "orders.1", "p.#")}, LAG_TIMEOUT,
             message="an unbinding mirrored")
    publishing = refusal(site.standby.address, "orders.0", sender=True)
    assert "queue 'orders.0' is a mirror of cluster 'site-a': read-only on this standby" in publishing
    assert "not publish to it" in publishing
    assert "not consume from it" in refusal(site.standby.address, "orders.0", sender=False)
    # nor does it reach the queue another way: the anonymous relay (`to`), an exchange bound to it
    assert "read-only on this standby" in publish_refused(site.standby.address, None, "orders.0")
    with AdminClient(site.standby.address, 5.0) as admin:
        for request in [("CREATE", "exchange", "fan", {"type": "fanout"}),
                        ("CREATE", "binding", None, {"exchange": "fan", "queue": "orders.0"})]:
            code, description, _ = admin.request(*request)
            assert code < 300, description
    assert "queue 'orders.0' is a mirror of cluster 'site-a'" in publish_refused(site.standby.address, "fan", None)
    assert "read-only on this standby" in publish_refused(site.standby.address, None, "fan")
    assert [m.body for m in browse(site.standby.address, "orders.0", 10)] == list(range(10))
    # the mirror user may do nothing but mirror
    assert "user 'mirror' may not send to 'orders.9'" in refusal(site.standby.address, "orders.9", sender=True,
                                                                 user=MIRROR_USER, password=MIRROR_PASSWORD)

    refused_promotion = promote(site)
    assert refused_promotion.returncode != 0
    assert "standby cannot be promoted: cluster 'site-a' is mirroring into it" in refused_promotion.stderr
    promoted = promote(site, "--force")
    assert promoted.returncode == 0, promoted.stderr
    assert {k: json.loads(promoted.stdout)[k] for k in ("role", "epoch")} == {"role": "promoted", "epoch": 2}
    fence = "fenced: this standby was promoted at mirror epoch 2"
    wait_for(lambda: refused(site, fence), LAG_TIMEOUT, message="the source naming the fence")
    with AdminClient(site.standby.address, 5.0) as admin:  # the fence is not an admin's to lift
        for operation in ("DELETE", "PURGE"):
            code, description, _ = admin.request(operation, "queue", "$mirror.epoch")
            assert code == 403 and description.startswith(
                "queue '$mirror.epoch' holds this cluster's mirror epoch, its fence against the sources it was "
                f"promoted over: an admin may not {operation.lower()} it"), (code, description)
    publish(site, "orders.0", 10, 5)  # the source goes on serving its clients: none of it reaches the standby
    assert "mirrors at epoch 1, from before it" in source_status(site)["down"]
    # the standby's clients publish to and consume from the queue, directly and through the exchange
    send_all(site.standby.address, "orders.0", [Message(id="standby-0", body=100, durable=True)])
    send_all(site.standby.address, "fan", [Message(id="standby-1", body=101, durable=True)])
    send_all(site.standby.address, "orders", [Message(id="standby-2", body=102, subject="o.x", durable=True)])
    assert [m.body for m in receive(site.standby.address, "orders.0", 13)] == list(range(10)) + [100, 101, 102]
    assert mirror_status(site.standby.address)["standby"]["queues"][0]["messages"] == 0


def test_fail_back_reverses_the_mirror(sites) -> None:
    """The source's site lost (what it confirmed after the cut never mirrored), the standby promoted and used; the
    old site back, accepting the mirror, and `mirror reverse` on the new side: the old site's queues become mirrors
    of the new source and end holding exactly what it holds, what the old site had that was never mirrored is kept
    aside (a diverged file), and a client's link to one of its queues is closed as it is marked."""
    site = sites(queues=["orders.*"], back=True)
    queues = MIRRORED[:2]
    under_load([(publish, site, q, 0, 100) for q in queues] + [(consume, site, "orders.0", 30)])
    wait_for(lambda: mirroring_only(site, queues), LAG_TIMEOUT, message="the mirror's lag drains")
    expected = {q: site.ledger.remaining(q) for q in queues}
    site.relay.cut()
    publish(site, "orders.0", 100, 10)  # confirmed at the old source, never mirrored
    for broker in site.source:
        site.source.kill(broker)
    assert promote(site).returncode == 0
    standby = site.standby.address
    assert [m.id for m in receive(standby, "orders.0", 20)] == expected["orders.0"][:20]
    send_all(standby, "orders.0", [Message(id=f"b-{i}", body=i, durable=True) for i in range(5)])
    expected["orders.0"] = expected["orders.0"][20:] + [f"b-{i}" for i in range(5)]

    for broker in site.source:  # the old site back, given the mirror user of the new source's and accepting it
        accept_back(broker.config)
    site.primary = site.source.start_cluster()
    conn = connect(site.source.public)
    sender = conn.create_sender("orders.0")  # attached before the queue becomes a mirror
    reversed_ = run_haqueue(["admin", "-b", standby, "mirror", "reverse"])
    assert reversed_.returncode == 0, reversed_.stderr
    assert json.loads(reversed_.stdout)["reversed_to"] == "site-a"
    status = wait_for(lambda: only(mirror_status(standby)["source"], queues), LAG_TIMEOUT,
                      message="the mirror back drains")
    assert status["epoch"] == 3, status
    with pytest.raises(LinkDetached) as closed:
        conn.wait(lambda: False, timeout=LAG_TIMEOUT, msg="the old site's client link closed")
    assert "queue 'orders.0' is now a mirror of cluster 'site-b'" in str(closed.value)
    conn.close()
    for queue in queues:
        assert [m.id for m in site.source.browse(site.primary, queue)] == expected[queue], queue
        assert [m.id for m in browse(standby, queue, len(expected[queue]))] == expected[queue], queue
    kept = diverged_files(site.primary.config["data_dir"])
    assert len(kept) == 1 and "orders.0" in kept[0].name, kept
    assert [_decoded(data).id for _, data in read_messages(kept[0])] == [f"orders.0-{i}" for i in range(100, 110)]
    old = mirror_status(site.primary.address, "ops", site.source.password)["standby"]
    assert (old["role"], old["epoch"]) == ("standby", 3), old
    assert "read-only on this standby" in refusal(site.source.public, "orders.1", sender=True)


def _decoded(data: bytes) -> Message:
    message = Message()
    message.decode(bytes(data))
    return message


def promote(site: Sites, *options: str) -> Any:
    """`haqueue admin mirror promote` on the standby, as an operator types it."""
    return run_haqueue(["admin", "-b", site.standby.address, "mirror", "promote", *options])


def refusal(address: str, queue: str, sender: bool, **auth: Any) -> str:
    """Why a client's link to `queue` at `address` is refused (it must be)."""
    conn = connect(address, **auth)
    try:
        with pytest.raises(LinkDetached) as refused:
            (conn.create_sender if sender else conn.create_receiver)(queue)
        return str(refused.value)
    finally:
        conn.close()


def publish_refused(address: str, target: str | None, to: str | None) -> str:
    """Why a message sent on a link to `target` (None: the anonymous relay), addressed `to`, is rejected (it must
    be)."""
    conn = connect(address)
    try:
        delivery = conn.create_sender(target).link.send(Message(address=to, body="x", durable=True))
        conn.wait(lambda: delivery.settled, timeout=10, msg="the publish's outcome")
        assert delivery.remote_state == Delivery.REJECTED, delivery.remote_state
        assert delivery.remote.condition.name == "amqp:not-allowed", delivery.remote.condition
        return str(delivery.remote.condition.description)
    finally:
        conn.close()


def test_a_scheduled_message_is_mirrored_in_its_place(sites) -> None:
    """A message held back until a time (x-opt-delivery-time) is mirrored at once (a browser would pass it by while it
    is held back), in its place in the queue's order. The source's store pages messages out of memory (page_above 1
    byte: those that come once it pages go straight to the pager, and each read back brings one), so the mirror reads
    them back one by one after the link was cut, the scheduled one among them."""
    site = sites(queues=["orders.*"], source_extra={"store": {"page_above": 1}})
    due = int(time.time() * 1000) + 5000
    messages = [Message(id=f"orders.0-{i}", body=i, durable=True,
                        annotations={"x-opt-delivery-time": due} if i == 4 else None) for i in range(6)]
    site.relay.cut()  # the mirror between links: the queue pages before it reads
    send_all(site.source.public, "orders.0", messages[:3])
    wait_for(lambda: "queue orders.0 pages" in site.primary.log(), 15, message="orders.0 paged at the source")
    send_all(site.source.public, "orders.0", messages[3:])
    site.ledger.confirmed["orders.0"] = [m.id for m in messages]
    site.relay.heal()
    wait_for(lambda: _drained_one(site, "orders.0"), LAG_TIMEOUT, message="orders.0 mirrored, the scheduled one too")
    assert {q["queue"]: q["messages"] for q in mirror_status(site.standby.address)["standby"]["queues"]} == \
        {"orders.0": 6}
    expected = site.ledger.remaining("orders.0")
    wait_for(lambda: browsed(site.standby.address, "orders.0", 6) == expected, 15, message="all 6 there once due")


def browsed(address: str, queue: str, n: int) -> list[str] | None:
    """The ids of the first n messages a browser is given, None if it is given fewer (held back, or not there)."""
    try:
        return [m.id for m in browse(address, queue, n, timeout=1.0)]
    except Timeout:
        return None


def test_a_queue_deleted_at_the_source_is_deleted_on_the_standby(sites) -> None:
    """Deleted while the site link is cut (its mirror between links): once the link is back the standby deletes its
    copy, and the rest is mirrored; deleted while the link is up: at once. A mirror queue an admin deletes on the
    standby while it is mirrored is made again and sent whole (the standby ends the source's connection, naming
    why, and the source resumes), and said in the standby's log."""
    site = sites(queues=["orders.*"])
    for queue in MIRRORED:
        publish(site, queue, 0, 5)
    wait_for(lambda: drained(site), LAG_TIMEOUT, message="the mirror's lag drains")
    site.relay.cut()
    site.source.request(site.primary, "DELETE", "queue", "orders.0")
    publish(site, "orders.1", 5, 5)
    site.relay.heal()
    status = wait_for(lambda: mirroring_only(site, MIRRORED[1:]), LAG_TIMEOUT, message="orders.1 and .2 mirrored")
    assert [q["lag_messages"] for q in status["queues"]] == [0, 0]
    assert [m.id for m in browse(site.standby.address, "orders.1", 10)] == site.ledger.remaining("orders.1")
    wait_for(lambda: standby_queues(site) == {"orders.1", "orders.2"}, LAG_TIMEOUT, message="orders.0 deleted there")
    site.source.request(site.primary, "DELETE", "queue", "orders.2")
    wait_for(lambda: standby_queues(site) == {"orders.1"}, LAG_TIMEOUT, message="orders.2 deleted there")

    with AdminClient(site.standby.address, 5.0) as admin:  # an admin's delete on the standby, the link attached
        code, description, _ = admin.request("DELETE", "queue", "orders.1")
    assert code == 204, description
    publish(site, "orders.1", 10, 5)
    wait_for(lambda: mirroring_only(site, ["orders.1"]), LAG_TIMEOUT, message="orders.1 mirrored again")
    assert [m.id for m in browse(site.standby.address, "orders.1", 15)] == site.ledger.remaining("orders.1")
    assert "queue 'orders.1', a mirror of cluster 'site-a', was deleted on standby while mirrored: it is made " \
           "again here and sent whole" in site.standby.log()


def standby_bindings(site: Sites) -> set[tuple[str, str, str]]:
    with AdminClient(site.standby.address, 5.0) as admin:
        return {(b["exchange"], b["queue"], b["key"]) for b in admin.query("binding")}


def standby_queues(site: Sites) -> set[str]:
    return {q["queue"] for q in mirror_status(site.standby.address)["standby"]["queues"]}


def mirroring_only(site: Sites, queues: list[str]) -> dict[str, Any] | None:
    """The source's status once it mirrors exactly `queues`, connected, with nothing held back."""
    return only(source_status(site), queues)


def only(status: dict[str, Any], queues: list[str]) -> dict[str, Any] | None:
    """A source's `status` if it mirrors exactly `queues`, connected, with nothing held back."""
    ok = status["connected"] and [q["queue"] for q in status["queues"]] == queues and all(
        q["state"] == "mirroring" and q["lag_messages"] == 0 for q in status["queues"])
    return status if ok else None


def test_a_standby_cluster_takes_the_mirror_once_its_feature_flag_is_on(sites) -> None:
    """A standby cluster that does not have the flag `mirror` enabled (upgraded from a release without it) refuses
    the mirror, naming the flag; the source says why in its status, keeps the lag, and mirrors once it is enabled."""
    site = sites(queues=["orders.*"], standby_size=1, standby_features=["diverged-file-header"])
    publish(site, "orders.0", 0, 10)
    refusal = "the feature flag mirror is not enabled in b0's cluster: enable it once every member runs 0.2.0"
    status = wait_for(lambda: refused(site, refusal), LAG_TIMEOUT, message="the source naming the standby's refusal")
    assert not status["connected"] and status["queues"][0]["lag_messages"] == 10, status
    enabled = run_haqueue(["admin", "-b", site.standby.address, "--user", "ops", "--password",
                           site.standby.config["users"]["ops"]["password"], "cluster", "features", "enable", "mirror"])
    assert enabled.returncode == 0, enabled.stderr
    wait_for(lambda: _drained_one(site, "orders.0"), LAG_TIMEOUT, message="orders.0 mirrored once the flag is on")
    assert [m.body for m in browse(site.standby.address, "orders.0", 10)] == list(range(10))


def refused(site: Sites, reason: str) -> dict[str, Any] | None:
    """The source's status once it says the standby refuses it for `reason`."""
    status = source_status(site)
    return status if reason in (status["down"] or "") else None


def source_status(site: Sites) -> dict[str, Any]:
    return mirror_status(site.primary.address, "ops", site.source.password)["source"]


def _drained_one(site: Sites, queue: str) -> bool:
    status = source_status(site)
    return any(q["queue"] == queue and q["state"] == "mirroring" and q["lag_messages"] == 0
               for q in status["queues"])


@pytest.mark.parametrize("section, line", [
    ({"to": ["127.0.0.1:5672"]}, "f.yaml: mirror.cluster: missing"),
    ({"queues": ["orders.*"]}, "f.yaml: mirror.queues: given but mirror.to names no standby"),
    ({"accept_from": ["nobody"]}, "f.yaml: mirror.accept_from[0]: names \"nobody\", not one of this broker's users"),
    ({"to": ["standby"], "cluster": "a", "username": "u", "password": "p"}, "f.yaml: mirror.to[0]: must be HOST:PORT"),
    ({"to": ["h:1"], "cluster": "a", "username": "u", "password": "p", "queue": ["x"]},
     "f.yaml: mirror.queue: unknown key"),
    ({}, "f.yaml: mirror: names no standby (to) and accepts no mirror (accept_from)"),
])
def test_bad_mirror_config_refused(section: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        broker_config({"mirror": section}, "f.yaml")
    assert str(refused.value).startswith(line), refused.value


def test_broker_refuses_a_bad_mirror_section(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text("mirror:\n  to: [\"127.0.0.1:5672\"]\n  queues: [\"orders.*\"]\n")
    result = run_haqueue(["broker", "--config", str(path)])
    assert result.returncode == 2
    assert f"{path}: mirror.cluster: missing (mirror.to names a standby" in result.stderr
