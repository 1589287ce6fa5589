"""Thousands of idle AMQP connections, each with a receiving link, opened in seconds: for the tests of the
connection limits and the benchmarks of what a connection costs (proton's BlockingConnection opens one at a
time, waiting for each).

    with IdleConnections("127.0.0.1", 5672, address="idle") as crowd:
        opened = crowd.open(10_000)     # Opened(admitted=10000, refused=Counter(), seconds=4.2)
        crowd.open(1).refused           # Counter({'amqp:resource-limit-exceeded: too many connections (...)': 1})
        len(crowd)                      # connections held open

Each connection is an anonymous client without SASL: the protocol header, open, begin, the attach of a receiver
on `address` and `credit` for it, the same bytes for every one, encoded once by proton. It is admitted once the
broker's attach answers with the source; refused at the broker's close or detach (counted by condition and
description), when the broker closes the socket, or when nothing answers within `timeout`. Admitted ones stay
open on a thread of their own (an asyncio loop), sending an empty frame every `heartbeat` seconds so that the
broker's idle timeout never closes them, until `close`.
"""
from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Coroutine, TypeVar

from proton import Connection, Data, Described, Transport

from haqueue.broker.connection_limits import raise_descriptor_limit

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # a heartbeat
CLOSE_FRAME = b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x18\x45"  # close, without an error
ATTACH, DETACH, END, CLOSE = 0x12, 0x16, 0x17, 0x18
ERROR_FIELD = {DETACH: 2, END: 0, CLOSE: 0}  # where each performative that ends something has its error

T = TypeVar("T")


@dataclass
class Opened:
    """What one `open` got: connections admitted, refusals by their description, and how long it took."""
    admitted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


class IdleConnections:
    def __init__(self, host: str, port: int, address: str = "idle", credit: int = 1, heartbeat: float = 15.0,
                 concurrency: int = 200, timeout: float = 30.0) -> None:
        self.host, self.port = host, port
        self.opening = opening_bytes(address, credit)
        self.heartbeat = heartbeat
        self.concurrency = concurrency  # connections in their handshake at once (the broker's backlog is 1024)
        self.timeout = timeout  # seconds one connection may take to be answered
        self.held: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}  # admitted, with the task reading each
        raise_descriptor_limit()  # each connection is a descriptor here too
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="idle-connections", daemon=True)
        self.thread.start()
        self.beating = asyncio.run_coroutine_threadsafe(self._beat(), self.loop)

    def open(self, n: int) -> Opened:
        """Open `n` more connections; returns once each is admitted or refused."""
        return self._call(self._open(n), None)

    def __len__(self) -> int:
        return len(self.held)

    def close(self) -> None:
        """Close every connection and stop the thread."""
        if self.thread.is_alive():
            self.beating.cancel()
            self._call(self._close(), 60.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()

    def __enter__(self) -> "IdleConnections":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the loop's thread --------------------------------------------------------------------
    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            for writer in self.held:
                writer.write(EMPTY_FRAME)

    async def _open(self, n: int) -> Opened:
        started = time.monotonic()
        gate = asyncio.Semaphore(self.concurrency)
        refusals = await asyncio.gather(*(self._open_one(gate) for _ in range(n)))
        refused = Counter(r for r in refusals if r is not None)
        return Opened(n - sum(refused.values()), refused, time.monotonic() - started)

    async def _open_one(self, gate: asyncio.Semaphore) -> str | None:
        """None once admitted (then held), else why not."""
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout)
            except (OSError, asyncio.TimeoutError) as e:
                return f"cannot connect: {e!r}"
            writer.write(self.opening)
            try:
                refusal = await asyncio.wait_for(_answer(reader), self.timeout)
            except asyncio.TimeoutError:
                refusal = f"no answer within {self.timeout} s"
            except (OSError, asyncio.IncompleteReadError):
                refusal = "closed by the broker before it answered"
        if refusal is not None:
            writer.close()
            return refusal
        self.held[writer] = asyncio.get_running_loop().create_task(self._hold(reader, writer))
        return None

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read (and ignore) what the broker sends until it closes the connection."""
        try:
            while await reader.read(65536):
                pass
        except OSError:
            pass
        self.held.pop(writer, None)
        writer.close()

    async def _close(self) -> None:
        """Close each connection as a client does (a dropped socket is a warning in the broker's log)."""
        held, self.held = self.held, {}
        for writer, task in held.items():
            task.cancel()
            writer.write(CLOSE_FRAME)
            writer.close()
        await asyncio.gather(*(writer.wait_closed() for writer in held), return_exceptions=True)


def opening_bytes(address: str, credit: int) -> bytes:
    """What a client sends to open a connection with one receiver on `address`, encoded by proton."""
    conn = Connection()
    conn.container = "idle-connections"
    transport = Transport()
    transport.bind(conn)
    conn.open()
    session = conn.session()
    session.open()
    receiver = session.receiver("idle")
    receiver.source.address = address
    receiver.open()
    receiver.flow(credit)
    data = transport.peek(transport.pending())
    assert data is not None
    return bytes(data)


async def _answer(reader: asyncio.StreamReader) -> str | None:
    """Read the broker's answer to `opening_bytes`: None once the attach came back with a source, else why not."""
    if await reader.readexactly(len(AMQP_HEADER)) != AMQP_HEADER:
        return "the broker answered another protocol header"
    while True:
        size, doff = struct.unpack(">IB", await reader.readexactly(5))
        body = (await reader.readexactly(size - 5))[doff * 4 - 5:]
        code = body[2] if body[:2] == b"\x00\x53" else None  # a performative described by a small ulong
        if code not in (ATTACH, DETACH, END, CLOSE):
            continue
        data = Data()
        data.decode(body)
        fields = _fields(data.get_object())
        if code == ATTACH and len(fields) > 5 and fields[5] is not None:  # its source: the broker took the link
            return None
        if code != ATTACH:
            index = ERROR_FIELD[code]
            return _error(fields[index] if len(fields) > index else None)


def _fields(value: object) -> list[Any]:
    """The fields of a described list (a performative, an error); none of anything else."""
    if isinstance(value, Described) and isinstance(value.value, list):
        return value.value
    return []


def _error(error: object) -> str:
    """An AMQP error, described [condition, description, info], as 'condition: description'."""
    fields = _fields(error)
    if not fields:
        return "closed without an error"
    return f"{fields[0]}: {fields[1] if len(fields) > 1 else None}"
