"""AMQP error conditions the broker reports, and the exception that carries one."""
from __future__ import annotations

from typing import Any

NOT_FOUND = "amqp:not-found"
INVALID_FIELD = "amqp:invalid-field"
RESOURCE_LOCKED = "amqp:resource-locked"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
RESOURCE_DELETED = "amqp:resource-deleted"
UNAUTHORIZED = "amqp:unauthorized-access"
NOT_ALLOWED = "amqp:not-allowed"
NOT_IMPLEMENTED = "amqp:not-implemented"
INTERNAL = "amqp:internal-error"
DECODE = "amqp:decode-error"
CONNECTION_FORCED = "amqp:connection:forced"
CONNECTION_REDIRECT = "amqp:connection:redirect"  # its info says where to connect instead (AMQP 1.0, 2.8.16)
LINK_REDIRECT = "amqp:link:redirect"  # its info says where the link's terminus is (AMQP 1.0, 2.8.17)
TXN_UNKNOWN = "amqp:transaction:unknown-id"
TXN_ROLLBACK = "amqp:transaction:rollback"
FRAMING_ERROR = "amqp:connection:framing-error"

# The management status code for each condition (design/management.md).
STATUS = {NOT_FOUND: 404, INVALID_FIELD: 400, RESOURCE_LOCKED: 409, RESOURCE_LIMIT: 403,
          UNAUTHORIZED: 403, NOT_ALLOWED: 403, DECODE: 400, NOT_IMPLEMENTED: 501}


class BrokerError(Exception):
    """A refusal with an AMQP condition and a description a client can read."""

    def __init__(self, condition: str, description: str, info: dict[str, Any] | None = None) -> None:
        """`info`: the condition's info map (its keys are sent as symbols), e.g. where a redirect points."""
        super().__init__(description)
        self.condition = condition
        self.description = description
        self.info = info

    @property
    def status(self) -> int:
        return STATUS.get(self.condition, 500)


class RecoveryError(Exception):
    """The broker's durable state cannot be read back; it must not start (exit code 2)."""
