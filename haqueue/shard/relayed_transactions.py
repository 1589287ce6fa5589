"""A client's transaction whose work is relayed to one shard's primary (design/sharding.md, "Transactions
through the relay").

The client's coordinator link stays at the entry process (broker/transactions.py holds its transaction).
The first relayed transfer or outcome under it makes the owning shard's primary its participant: a
transaction is declared there over the relay's owner connection (one coordinator link per owner connection,
attached when first needed), the client's transfers and outcomes are passed on under that transaction's id,
and the client's discharge is passed there and answered with its outcome. Work under it anywhere else is
refused (`Transactions.mixed`): there is no two-phase commit. When the owner connection drops (its primary
failed) the transaction is gone with it: a commit is answered amqp:transaction:rollback, its publishes not
yet settled are refused and never sent again, and the next primary delivers again what the client accepted.
"""
from __future__ import annotations

from typing import Any, Callable

from proton import Described, Message, symbol

from ..broker.connection import Connection
from ..broker.errors import INTERNAL, NOT_IMPLEMENTED, TXN_ROLLBACK, BrokerError
from ..broker.proton_adapter import ACCEPTED, DECLARED, Link, LinkHandler
from ..broker.transactions import Transaction, Transactions
from .relay import OwnerConnection

Answer = Callable[[str | None, str], None]  # (None, "") done as asked, or (condition, description)


def _lost_owner(shard: int) -> str:
    return f"shard {shard}'s primary, which held its work, was lost (the relay's connection to it dropped)"


def _control(name: str, fields: list[Any]) -> bytes:
    return bytes(Message(body=Described(symbol(name), fields)).encode())


class RemoteTransaction:
    """A client's transaction as one shard's primary holds it: the participant its discharge is handed to."""

    def __init__(self, coordinator: "OwnerCoordinator", txn: Transaction) -> None:
        self.coordinator = coordinator
        self.txn = txn
        self.name = f"shard {coordinator.owner.shard}'s primary"
        self.owner_id: bytes | None = None  # the owner's id for it, once declared there
        self.asked: str | None = None  # the control message last sent for it: "declare", then "discharge"
        self.lost: str | None = None  # why the owner no longer holds it
        self.unsent = 0  # transfers under it still waiting in relayed publishers: its discharge goes after them
        self.discharging: tuple[bool, Answer] | None = None  # (fail, answer) once the client discharged it
        self._when_declared: list[Callable[[], None]] = []
        self._at_discharge: list[Callable[[], None]] = []  # the client's deliveries it settles, settled then

    def when_declared(self, callback: Callable[[], None]) -> None:
        """`callback` once the owner has declared it (at once if it has), or once it is lost."""
        if self.owner_id is not None or self.lost is not None:
            callback()
        elif callback not in self._when_declared:
            self._when_declared.append(callback)

    def at_discharge(self, callback: Callable[[], None]) -> None:
        self._at_discharge.append(callback)

    def sent_one(self) -> None:
        self.unsent -= 1
        if not self.unsent:
            self.coordinator.pump()

    def lost_refusal(self) -> tuple[str, str]:
        """What a client is told of work under it once it is lost."""
        name = self.txn.id.decode("utf-8", "replace")
        lost = self.lost or _lost_owner(self.coordinator.owner.shard)  # a link may hear of the loss first
        if self.asked == "discharge" and self.discharging is not None and not self.discharging[0]:
            return INTERNAL, (f"the outcome of transaction '{name}' is unknown: {lost} after its commit was "
                              f"asked for (it may have committed)")
        return TXN_ROLLBACK, f"transaction '{name}' was rolled back: {lost}"

    # -- Participant (broker/transactions.py) ------------------------------------------------------
    def discharge(self, fail: bool, done: Answer) -> None:
        self.discharging = (fail, done)
        self.coordinator.pump()

    # -- the owner's answers ------------------------------------------------------------------------
    def control(self) -> bytes | None:
        """The control message it waits to send, now taken as sent: its declare, then, once declared,
        discharged by the client and every transfer under it passed on, its discharge."""
        if self.asked is None:
            self.asked = "declare"
            return _control("amqp:declare:list", [])
        if self.asked == "declare" and self.owner_id is not None and self.discharging is not None \
                and not self.unsent and not self._when_declared:
            self.asked = "discharge"
            return _control("amqp:discharge:list", [self.owner_id, self.discharging[0]])
        return None

    def declared(self, owner_id: bytes) -> None:
        self.owner_id = owner_id
        self._declared_or_lost()

    def lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            self._declared_or_lost()

    def _declared_or_lost(self) -> None:
        while self._when_declared:  # the discharge waits until the work they pass on has gone before it
            self._when_declared.pop(0)()

    def answered(self, error: tuple[str, str] | None) -> None:
        """The owner answered its discharge (or it is lost: `error` from `lost_refusal`)."""
        assert self.discharging is not None
        self.coordinator.forget(self)
        for settle in self._at_discharge:
            settle()
        fail, done = self.discharging
        if fail or error is None:
            done(None, "")  # rolled back as asked (a lost one is rolled back too), or committed
        else:
            done(*error)


class OwnerCoordinator(LinkHandler):
    """The relay's transaction controller at one shard's primary: a coordinator link on the owner connection,
    attached when a transaction first needs it, carrying every relayed transaction's declare and discharge."""

    def __init__(self, owner: OwnerConnection) -> None:
        self.owner = owner
        self.link: Link | None = None
        self.added = False  # in the owner connection's links
        self.transactions: list[RemoteTransaction] = []  # not yet answered
        self.sent: dict[int, RemoteTransaction] = {}  # control deliveries the owner has not settled

    def declare(self, txn: Transaction) -> RemoteTransaction:
        remote = RemoteTransaction(self, txn)
        self.transactions.append(remote)
        if not self.added:
            self.added = True
            self.owner.add(self)
        self.pump()
        return remote

    def forget(self, remote: RemoteTransaction) -> None:
        self.transactions.remove(remote)

    def pump(self) -> None:
        for remote in list(self.transactions):
            if remote.lost is not None:
                if remote.discharging is not None:
                    remote.answered(remote.lost_refusal())
                continue
            link = self.link
            if link is None or link.credit() <= 0:
                continue
            data = remote.control()
            if data is not None:
                delivery = link.send(data)
                assert delivery is not None  # sent unsettled
                self.sent[delivery] = remote

    def _lose_all(self, why: str) -> None:
        self.link, self.added = None, False
        self.sent.clear()
        for remote in list(self.transactions):
            remote.lose(why)
        self.pump()

    # -- Relayed (relay.py) -------------------------------------------------------------------------
    def attach(self, conn: Connection) -> None:
        self.link = conn.open_link(True, "", self.owner.relay.link_name("txn-controller"), self, coordinator=True)

    def owner_lost(self) -> None:
        self.owner.remove(self)  # attached again when a transaction needs it
        self._lose_all(_lost_owner(self.owner.shard))

    def give_up(self, condition: str, description: str) -> None:
        self._lose_all(description)

    # -- the coordinator link -----------------------------------------------------------------------
    def on_credit(self) -> None:
        self.pump()

    def on_outcome(self, delivery: int, outcome: int, failed: bool, undeliverable: bool) -> None:
        remote = self.sent.pop(delivery, None)
        if remote is None:
            return
        if remote.asked == "declare":
            fields = Link.state_fields(delivery)
            if outcome == DECLARED and fields and fields[0] is not None:
                remote.declared(bytes(fields[0]))
            else:
                error = Link.outcome_error(delivery) or ("", f"outcome {outcome}")
                remote.lose(f"shard {self.owner.shard}'s primary refused to declare it ({error[0]}: {error[1]})")
            self.pump()
            return
        if outcome == ACCEPTED:
            remote.answered(None)
            return
        condition, description = Link.outcome_error(delivery) or (TXN_ROLLBACK, f"outcome {outcome}")
        remote.answered((condition, f"transaction '{remote.txn.id.decode('utf-8', 'replace')}' was not "
                                    f"committed on shard {self.owner.shard}'s primary: {description}"))

    def on_detach(self) -> None:
        link = self.link
        if link is None or link.conn.client_error is not None:
            return  # closed with its connection: owner_lost follows
        self.owner.remove(self)
        self._lose_all(f"shard {self.owner.shard}'s primary detached the relay's transaction controller "
                       f"({link.remote_error()})")


class RelayedTransactions:
    """The entry process's transactions whose work is relayed: which owner each is bound to."""

    def __init__(self, transactions: Transactions) -> None:
        self.transactions = transactions
        self._coordinators: dict[int, OwnerCoordinator] = {}

    def bind(self, txn_id: bytes, conn: Connection, owner: OwnerConnection) -> RemoteTransaction:
        """The transaction `txn_id` of the client's connection `conn`, at `owner`'s shard: declared there by
        its first relayed work. Raises BrokerError if it is unknown, lost, or has its work elsewhere."""
        txn = self.transactions.find(txn_id, conn)
        remote = txn.elsewhere
        if isinstance(remote, RemoteTransaction) and remote.coordinator.owner is owner:
            if remote.lost is not None:
                raise BrokerError(*remote.lost_refusal())
            return remote
        second = f"shard {owner.shard}'s primary"
        if remote is not None or txn.has_work_here:
            first = remote.name if remote is not None else self.transactions.here
            raise BrokerError(NOT_IMPLEMENTED, self.transactions.mixed(txn, first, second))
        coordinator = self._coordinators.get(owner.shard)
        if coordinator is None:
            coordinator = self._coordinators[owner.shard] = OwnerCoordinator(owner)
        remote = txn.elsewhere = coordinator.declare(txn)
        return remote

    def refuse_outcome(self, txn_id: bytes, conn: Connection, description: str) -> None:
        """An outcome under `txn_id` could not join it: it has no answer of its own, so the commit says it."""
        txn = self.transactions.active.get(txn_id)
        if txn is not None and txn.controller.conn is conn:
            txn.doomed = txn.doomed or description
