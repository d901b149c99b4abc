"""One root, so ``except OutboxError`` catches everything the outbox raises on purpose.

Configuration mistakes are ``ImproperlyConfigured`` (Django's convention, and never swallowed by a
catch-all around a send). Delivery errors are split by what the relay should do next: try again later,
or give up at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .store.models import Message  # where it is defined: models.py imports what imports this module

__all__ = [
    "DeliveryError",
    "DeliveryTimeoutError",
    "IdempotencyConflictError",
    "MissingExtraError",
    "OutboxError",
    "OutboxImproperlyConfigured",
    "PayloadTooLargeError",
    "PermanentDeliveryError",
    "TransientDeliveryError",
    "UnknownTopicError",
]


class OutboxError(Exception):
    """Base class of every error the outbox raises on purpose."""


class UnknownTopicError(OutboxError, LookupError):
    """No route and no handler serves the topic, so the message could never be delivered."""


class PayloadTooLargeError(OutboxError, ValueError):
    """The encoded payload is larger than ``OUTBOX["MAX_PAYLOAD_BYTES"]``."""


class IdempotencyConflictError(OutboxError, ValueError):
    """An ``idempotency_key`` was sent again with another topic, key or payload.

    Returning the first message would drop the second one silently; the key was reused by mistake (a
    key derived from too little), so the caller must hear of it. Nothing was written, and the caller's
    transaction is still usable. ``existing`` is the stored message that holds the key, or None when
    the holder is an earlier item of the same ``send_many()`` call (which was not written either).
    """

    def __init__(self, message: str, *, existing: Message | None) -> None:
        super().__init__(message)
        self.existing = existing


class DeliveryError(OutboxError):
    """A destination did not accept a message. Raised by transports; retried by default."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        #: Seconds the destination asked us to wait (e.g. HTTP ``Retry-After``), or None.
        self.retry_after = retry_after


class TransientDeliveryError(DeliveryError):
    """The destination may accept the message later: a timeout, a 503, a broker that is down."""


class DeliveryTimeoutError(TransientDeliveryError):
    """A delivery call ran past ``OUTBOX["HANDLER_TIMEOUT_SECONDS"]`` and was abandoned (it may still finish)."""


class PermanentDeliveryError(DeliveryError):
    """Retrying cannot help (a 4xx, an address that does not exist): the message goes ``dead`` at once."""


class OutboxImproperlyConfigured(OutboxError, ImproperlyConfigured):
    """The ``OUTBOX`` setting, a route or a transport's options are wrong."""


class MissingExtraError(OutboxImproperlyConfigured):
    """An optional dependency is missing; the message names the pip extra that installs it."""

    def __init__(self, *, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the {package!r} package. "
            f"Install it with: pip install 'django-transactional-outbox[{extra}]'"
        )
        self.package = package
        self.extra = extra
