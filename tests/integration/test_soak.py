"""A soak under hostile clients while a producer and a consumer run: 1,000 connections opened (some mid-way
through a large message, some holding messages of the consumers' queue) and dropped abruptly, a slow-loris
crowd, and 10,000 malformed frames. Nothing confirmed is lost, the broker serves throughout, and its RSS
comes back to within 10% of where it started."""
from __future__ import annotations

import os
import selectors
import socket
import struct
import time

import pytest
from proton import Data, Described, Endpoint, uint, ulong

from clients import AMQP_HEADER, SASL_HEADER, Client, RawAmqp, frame
from ha_harness import Load
from harness import rss, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HANDSHAKE_TIMEOUT = 2.0
QUEUE = "soak"


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def performative(descriptor: int, fields: list, channel: int = 0, payload: bytes = b"") -> bytes:
    data = Data()
    data.put_object(Described(ulong(descriptor), fields))
    return frame(bytes(data.encode()) + payload, channel=channel)


OPEN = performative(0x10, ["soak-malformed"])
BEGIN = performative(0x11, [None, uint(0), uint(100), uint(100)])


def sasl_frame(body: bytes) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


# What a hostile client sends; the broker must close each connection and nothing else.
MALFORMED = [
    AMQP_HEADER + struct.pack(">IBBH", 4, 2, 0, 0),  # a frame shorter than its own header
    AMQP_HEADER + struct.pack(">IBBH", 12, 1, 0, 0) + b"\0" * 4,  # data offset below 2
    AMQP_HEADER + struct.pack(">IBBH", 0xFFFFFFFF, 2, 0, 0),  # 4 GB, over any max-frame-size
    AMQP_HEADER + frame(b"\xff" * 24),  # a body that is no AMQP encoding
    AMQP_HEADER + OPEN + frame(b"\x00\x53\x7f\x45"),  # an unknown performative
    AMQP_HEADER + OPEN + BEGIN + performative(0x14, [uint(7), uint(0), b"t"], payload=b"x"),  # no such link
    AMQP_HEADER + OPEN + performative(0x12, ["l", uint(0), False], channel=9),  # attach on no session
    SASL_HEADER + sasl_frame(b"\xfe\xed garbage"),
    SASL_HEADER + sasl_frame(b"\x00\x53\x41\x71\x00\x00\x00\x05"),  # sasl-init as an int
    b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n",
]
SASL_OUTCOME = b"\x00\x53\x44"


class Crowd:
    """Many raw sockets at once, multiplexed with a selector (bounded waits throughout)."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.selector = selectors.DefaultSelector()

    def malformed(self, count: int, in_flight: int = 100, timeout: float = 120.0) -> int:
        """Send `count` malformed openings (MALFORMED in turn), each on its own connection; returns how many
        the broker closed (or, for SASL, refused with an outcome) within `timeout`."""
        sent = done = 0
        deadline = time.monotonic() + timeout
        while done < count and time.monotonic() < deadline:
            while sent < count and len(self.selector.get_map()) < in_flight:
                s = socket.create_connection(self.address, timeout=5)
                s.sendall(MALFORMED[sent % len(MALFORMED)])
                s.setblocking(False)
                self.selector.register(s, selectors.EVENT_READ, bytearray())
                sent += 1
            for key, _ in self.selector.select(timeout=1.0):
                s, received = key.fileobj, key.data
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                received += chunk
                if not chunk or received.startswith(SASL_HEADER) and SASL_OUTCOME in received:
                    self.selector.unregister(s)
                    s.close()
                    done += 1
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fileobj)
            key.fileobj.close()
        return done

    def slow_loris(self, count: int, every: float = 0.5, timeout: float = 15.0) -> list[float]:
        """`count` connections sending their opening a byte every `every` s, never finishing in time (half a
        header at a time, or a header then an endless open); seconds until the broker closed each."""
        openings = [AMQP_HEADER * 4, AMQP_HEADER + frame(b"\x00" * 64)]
        socks = {}
        started = time.monotonic()
        for i in range(count):
            s = socket.create_connection(self.address, timeout=5)
            s.setblocking(False)
            socks[s] = [openings[i % 2], 0]
        closed: dict[socket.socket, float] = {}
        while len(closed) < count and time.monotonic() - started < timeout:
            for s, state in socks.items():
                if s in closed:
                    continue
                try:
                    if state[1] < len(state[0]):
                        s.send(state[0][state[1]:state[1] + 1])
                        state[1] += 1
                    while s.recv(65536):
                        pass
                    closed[s] = time.monotonic() - started  # EOF
                except BlockingIOError:
                    continue
                except OSError:
                    closed[s] = time.monotonic() - started
            time.sleep(every)  # the loris' own pace
        for s in socks:
            s.close()
        return sorted(closed.values()) + [float("inf")] * (count - len(closed))


def open_and_drop(b, count: int) -> None:
    """`count` opened connections: a tenth hold messages of QUEUE unsettled, a fifth are part way through
    sending a 1 MB message; then every socket is reset without a word (SO_LINGER 0)."""
    raws: list[RawAmqp] = []
    # The counting client first: proton's blocking client waits with select(), which takes no socket
    # numbered past 1023, and the raw connections below take a thousand numbers.
    with Client(b) as c:
        try:
            _open(b, count, raws)
            wait_for(lambda: c.mgmt("READ", "broker").body["connections"] >= count + 1, 30,
                     message=f"{count} connections open at once")
        finally:
            for raw in raws:
                raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                raw.close()


def _open(b, count: int, raws: list[RawAmqp]) -> None:
    for i in range(count):
        raw = RawAmqp(b.host, b.port)
        raw.open()
        if i % 10 == 0:
            session = raw.conn.session()
            session.open()
            rcv = session.receiver(f"holder-{i}")
            rcv.source.address = QUEUE
            rcv.open()
            rcv.flow(3)
        elif i % 5 == 1:
            raw.send_part_of_a_message(f"partial-{i}", "soak.partial", 300_000)
        raw.pump(lambda: raw.conn.state & Endpoint.REMOTE_ACTIVE and raw.transport.pending() <= 0, timeout=10)
        raws.append(raw)


def test_soak_hostile_clients_while_serving(broker_factory):
    b = broker_factory(limits={"handshake_timeout": HANDSHAKE_TIMEOUT, "max_connections": 3000})
    crowd = Crowd(b.host, b.port)
    load = Load(b.address, QUEUE).start()
    try:
        wait_for(lambda: load.received_count() >= 50, 20, message="traffic before the soak")
        # a small round of everything first: what the broker allocates once is not a leak
        open_and_drop(b, 100)
        crowd.malformed(500)
        crowd.slow_loris(10)
        idle_fds = open_fds(b.pid)
        wait_for(lambda: open_fds(b.pid) <= idle_fds, 15, message="the warm-up's connections gone")
        before = rss(b.pid)

        open_and_drop(b, 1000)
        took = crowd.slow_loris(100)  # each one's opening outlasts the loris' 15 s: closed while still sending
        assert all(t < float("inf") for t in took), took
        assert crowd.malformed(10_000) == 10_000
        confirmed = load.confirmed_count()
        wait_for(lambda: load.confirmed_count() >= confirmed + 50, 20, message="publishes confirmed after the soak")

        wait_for(lambda: open_fds(b.pid) <= idle_fds, 20, message="every hostile connection gone")
        wait_for(lambda: rss(b.pid) <= before * 1.1, 10, message=f"the broker's RSS back within 10% of "
                 f"{before / 2 ** 20:.1f} MiB (now {rss(b.pid) / 2 ** 20:.1f} MiB)")
        after = rss(b.pid)
        print(f"\nRSS of the broker: {before / 2 ** 20:.1f} MiB before the soak, {after / 2 ** 20:.1f} MiB after")
        load.stop_producer()
        wanted = set(load.confirmed)
        wait_for(lambda: wanted <= set(load.received), 30, message=f"every confirmed message received "
                                                                     f"({load.report()})")
    finally:
        load.stop()
    report = load.report()
    print("load report:", report)
    assert report["lost"] == [], report
    assert b.running
