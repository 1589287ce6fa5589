"""A client's link to a queue of another shard, and its mirror link to that shard's primary.

Messages pass as bytes, undecoded. A publisher's delivery is settled with the owner's outcome only when
the owner settles it, so a confirm means what it means on the owner (at least once end to end); after a
failover every publish not yet settled is sent again, in order. A consumer's deliveries pass down and its
outcomes up; its credit and drain pass up. Credit: the client's publisher link keeps the engine's
byte-sized window (engine.py, `Link.received`), held whenever the owner's credit runs out or messages
wait; a consumer's mirror link holds its window and is granted exactly the client's credit (`Link.flow`).
Transfers and outcomes under a client's transaction pass under its transaction at the owner
(relayed_transactions.py); a transactional publish is never sent again after a failover.
"""
from __future__ import annotations

from collections import deque
from typing import Final

from proton import Described, ulong

from ..broker.connection import Connection
from ..broker.errors import BrokerError
from ..broker.proton_adapter import ACCEPTED, REJECTED, RELEASED, TRANSACTIONAL, Link, LinkHandler
from .relay import OwnerConnection
from .relayed_transactions import RelayedTransactions, RemoteTransaction

# A mirror link's property: the client user it acts for, whose rights the owner checks its attach against.
RELAYED_FOR: Final = "x-haqueue-relayed-for"


class _OwnerSide(LinkHandler):
    """The handler of a mirror link: what the owner does reaches the relayed link."""

    def __init__(self, relayed: "_Relayed") -> None:
        self.relayed = relayed
        self.link: Link | None = None  # the mirror link, once opened

    def on_message(self, delivery: int, data: bytes, settled: bool) -> None:
        self.relayed.owner_message(delivery, data, settled)

    def on_outcome(self, delivery: int, outcome: int, failed: bool, undeliverable: bool) -> None:
        self.relayed.owner_outcome(delivery, outcome, failed)

    def on_txn_outcome(self, delivery: int, txn_id: bytes, outcome: int) -> None:
        if self.link is not None:
            self.link.settle(delivery, 0)  # the owner settled it, taken into its transaction
        self.relayed.owner_txn_outcome(delivery, outcome)

    def on_credit(self) -> None:
        self.relayed.owner_credit()

    def on_detach(self) -> None:
        link = self.link
        if link is None or link is not self.relayed.mirror:
            return  # closed here, or its connection was lost (owner_lost came first)
        if link.conn.client_error is not None:
            return  # the owner is closing the connection (shutting down): owner_lost follows
        self.relayed.owner_detached(link.remote_error())  # the owner refused or detached this link


class _Relayed(LinkHandler):
    """What both directions share: the client link, its mirror, the owner connection."""

    def __init__(self, owner: OwnerConnection, link: Link, transactions: RelayedTransactions) -> None:
        self.owner = owner
        self.link = link
        self.transactions = transactions
        self.mirror: Link | None = None

    def _open_mirror(self, conn: Connection, sender: bool) -> Link:
        client = self.link  # a consumer's selector and browsing are the owner's to apply
        assert client.address is not None  # only links to a named address are routed
        side = _OwnerSide(self)
        mirror = conn.open_link(sender, client.address, self.owner.relay.link_name(client.name), side,
                                {RELAYED_FOR: client.conn.user or ""}, source_filters=client.honoured_filters,
                                browse=client.browse)
        side.link = self.mirror = mirror
        return mirror

    def attach(self, conn: Connection) -> None:
        """The owner connection is open: attach the mirror link."""

    def owner_lost(self) -> None:
        """The owner connection dropped, and the mirror link with it."""

    def owner_detached(self, error: str | None) -> None:
        self.mirror = None
        self.owner.remove(self)
        condition, _, description = (error or "amqp:link:detach-forced: the owning shard detached the link") \
            .partition(": ")
        self.link.close(condition, description)

    def give_up(self, condition: str, description: str) -> None:
        self.mirror = None
        self.link.close(condition, description)

    def on_detach(self) -> None:  # the client's link is gone
        self.owner.remove(self)
        mirror, self.mirror = self.mirror, None
        if mirror is not None:
            mirror.close()

    def owner_message(self, delivery: int, data: bytes, settled: bool) -> None:
        """A message from the owner (a consumer's mirror)."""

    def owner_outcome(self, delivery: int, outcome: int, failed: bool) -> None:
        """The owner settled a message sent to it (a publisher's mirror)."""

    def owner_txn_outcome(self, delivery: int, outcome: int) -> None:
        """The owner took a message sent to it into its transaction (a publisher's mirror)."""

    def owner_credit(self) -> None:
        """The owner sent a flow."""


class RelayedPublisher(_Relayed):
    """The client sends to a queue of another shard."""

    def __init__(self, owner: OwnerConnection, link: Link, transactions: RelayedTransactions) -> None:
        super().__init__(owner, link, transactions)
        link.hold_credit()  # no credit until the owner grants some
        # the client's deliveries the owner has not settled, in order: message, transaction
        self.unsettled: dict[int, tuple[bytes, RemoteTransaction | None]] = {}
        # (client delivery or 0 if pre-settled, message, transaction) to send
        self.waiting: deque[tuple[int, bytes, RemoteTransaction | None]] = deque()
        self.sent: dict[int, int] = {}  # mirror delivery -> client delivery
        owner.add(self)

    def attach(self, conn: Connection) -> None:
        self._open_mirror(conn, True)

    def owner_lost(self) -> None:
        """The owner is gone: whatever it did not settle is sent again, in order, to the next one, but for
        what was sent under a transaction, which went with it."""
        self.mirror = None
        self.sent.clear()
        settled_ones = [item for item in self.waiting if not item[0]]
        items = [(delivery, data, txn) for delivery, (data, txn) in self.unsettled.items()] + settled_ones
        self.waiting = deque(item for item in items if item[2] is None)
        for delivery, _, txn in items:
            if txn is not None:
                self._refuse(delivery, txn)
        self.link.hold_credit()

    def on_detach(self) -> None:
        for _, _, txn in self.waiting:
            if txn is not None:
                txn.sent_one()  # never to be sent: its discharge need not wait for it
        self.waiting.clear()
        super().on_detach()

    def _refuse(self, delivery: int, txn: RemoteTransaction) -> None:
        if delivery and self.unsettled.pop(delivery, None) is not None and not self.link.closed:
            self.link.settle(delivery, REJECTED, *txn.lost_refusal())

    def on_message(self, delivery: int, data: bytes, settled: bool) -> None:
        self._take(delivery, data, settled, None)

    def on_txn_message(self, delivery: int, data: bytes, settled: bool, txn_id: bytes) -> bool:
        try:
            txn = self.transactions.bind(txn_id, self.link.conn, self.owner)
        except BrokerError as e:  # refused alone: the transaction stays good for its participant
            self.link.settle(delivery, REJECTED, e.condition, e.description)
            return True
        txn.unsent += 1
        self._take(delivery, data, settled, txn)
        return True

    def _take(self, delivery: int, data: bytes, settled: bool, txn: RemoteTransaction | None) -> None:
        if not settled:
            self.unsettled[delivery] = (data, txn)
        self.waiting.append((0 if settled else delivery, data, txn))
        self._pump()

    def owner_credit(self) -> None:
        self._pump()

    def _pump(self) -> None:
        mirror = self.mirror
        if mirror is None:
            return
        while self.waiting and mirror.credit() > 0:
            delivery, data, txn = self.waiting[0]
            if txn is None:
                self.waiting.popleft()
                sent = mirror.send(data, settled=not delivery)
                if delivery and sent is not None:
                    self.sent[sent] = delivery
            elif txn.lost is not None:
                self.waiting.popleft()
                self._refuse(delivery, txn)
            elif txn.owner_id is None:
                txn.when_declared(self._pump)  # the messages behind it wait too, in order
                break
            else:
                self.waiting.popleft()
                sent = mirror.send(data)  # unsettled even if the client's was: the owner settles it in its transaction
                assert sent is not None
                mirror.in_transaction(sent, txn.owner_id)
                self.sent[sent] = delivery
                txn.sent_one()
        if self.waiting or mirror.credit() <= 0:
            self.link.hold_credit()
        elif self.link.held:
            self.link.resume_credit()

    def owner_outcome(self, delivery: int, outcome: int, failed: bool) -> None:
        client = self.sent.pop(delivery, 0)
        if client and self.unsettled.pop(client, None) is not None and not self.link.closed:
            error = Link.outcome_error(delivery) if outcome == REJECTED else None
            condition, description = error or (None, "")
            self.link.settle(client, outcome, condition, description, failed=failed)

    def owner_txn_outcome(self, delivery: int, outcome: int) -> None:
        client = self.sent.pop(delivery, 0)
        found = self.unsettled.pop(client, None) if client else None
        if found is not None and found[1] is not None and not self.link.closed:
            self.link.settle_with_state(client, TRANSACTIONAL, [found[1].txn.id, Described(ulong(outcome), [])])


class RelayedConsumer(_Relayed):
    """The client receives from a queue of another shard."""

    def __init__(self, owner: OwnerConnection, link: Link, transactions: RelayedTransactions) -> None:
        super().__init__(owner, link, transactions)
        self.buffer: deque[tuple[int, bytes]] = deque()  # (mirror delivery, message) not yet sent to the client
        self.held: dict[int, int] = {}  # client delivery -> mirror delivery, until the client settles it
        self.in_transaction: set[int] = set()  # client deliveries given an outcome in a transaction, until discharged
        self.draining = False  # the client's drain was passed up and the owner has not answered yet
        owner.add(self)

    def attach(self, conn: Connection) -> None:
        self._open_mirror(conn, False).hold_credit()  # its credit is the client's, granted below
        self.on_credit()

    def owner_lost(self) -> None:
        """The new primary delivers again what the old one had sent: what the client still holds from the
        old one is settled here when the client settles it, and dropped."""
        self.mirror = None
        self.buffer.clear()
        self.held.clear()
        self.draining = False

    # -- the client's side --------------------------------------------------------------------
    def on_credit(self) -> None:
        self._deliver()
        mirror = self.mirror
        credit = self.link.credit()
        drain = self.link.drain_asked() and credit > 0
        if mirror is None:
            return  # passed up once the mirror is attached (a drain too: the owner answers it)
        grant = max(credit - len(self.buffer) - mirror.credit(), 0)
        if drain and not self.draining:
            self.draining = True
            mirror.flow(grant, drain=True)
        elif grant:
            mirror.flow(grant)

    def on_outcome(self, delivery: int, outcome: int, failed: bool, undeliverable: bool) -> None:
        upstream = self.held.pop(delivery, 0)
        if upstream and self.mirror is not None:
            self.mirror.settle(upstream, outcome, failed=failed)

    def on_txn_outcome(self, delivery: int, txn_id: bytes, outcome: int) -> None:
        """An outcome under the client's transaction: given at the owner under its transaction; the client's
        delivery is settled when the transaction is discharged."""
        if delivery in self.in_transaction:
            return  # given already (the client settles it too): settled at the discharge
        upstream, mirror = self.held.pop(delivery, 0), self.mirror
        try:
            txn: RemoteTransaction | None = self.transactions.bind(txn_id, self.link.conn, self.owner)
        except BrokerError as e:
            self.transactions.refuse_outcome(txn_id, self.link.conn, e.description)
            txn = None
        if txn is None or not upstream or mirror is None:
            # refused, or sent by a primary since lost (the next one delivers it again): released, settled here
            if upstream and mirror is not None:
                mirror.settle(upstream, RELEASED)
            self.link.settle(delivery, 0)
            return
        self.in_transaction.add(delivery)
        txn.when_declared(lambda: self._pass_outcome(txn, mirror, upstream, delivery, outcome))

    def _pass_outcome(self, txn: RemoteTransaction, mirror: Link, upstream: int, delivery: int,
                      outcome: int) -> None:
        if txn.lost is None and mirror is self.mirror:
            assert txn.owner_id is not None
            mirror.in_transaction(upstream, txn.owner_id, outcome)

        def settle() -> None:  # the owner settled its delivery at the discharge; a lost mirror's are gone
            if mirror is self.mirror:
                mirror.settle(upstream, 0)
            self.in_transaction.discard(delivery)
            if not self.link.closed:
                self.link.settle(delivery, 0)
        txn.at_discharge(settle)

    # -- the owner's side ---------------------------------------------------------------------
    def owner_message(self, delivery: int, data: bytes, settled: bool) -> None:
        self.buffer.append((0 if settled else delivery, data))
        self._deliver()
        if self.draining and self.link.credit() <= 0:
            self.draining = False  # the drain's credit was all used: nothing left to answer

    def owner_credit(self) -> None:
        self._drain_answered()

    def _deliver(self) -> None:
        link = self.link
        while self.buffer and link.credit() > 0 and not link.output_full():
            upstream, data = self.buffer.popleft()
            sent = link.send(data, settled=link.settle_first)
            if not upstream or self.mirror is None:
                continue
            if sent is None:  # an at-most-once client: taken as sent
                self.mirror.settle(upstream, ACCEPTED)
            else:
                self.held[sent] = upstream

    def _drain_answered(self) -> None:
        """Once the owner has answered a drain (a flow leaving no credit: the messages it sent came before),
        the client's drain is answered too."""
        if self.draining and self.mirror is not None and self.mirror.credit() <= 0:
            self.draining = False
            self._deliver()
            self.link.drained()
