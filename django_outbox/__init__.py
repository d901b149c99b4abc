"""A transactional outbox for Django.

``outbox.send()`` writes a message in the caller's transaction; ``manage.py outbox_worker`` relays it
at least once. See docs/ for the guarantees.
"""

__version__ = "0.1.0"

from .api import Outbox, outbox
from .exceptions import (
    DeliveryError,
    DeliveryTimeoutError,
    IdempotencyConflictError,
    MissingExtraError,
    OutboxError,
    OutboxImproperlyConfigured,
    PayloadTooLargeError,
    PermanentDeliveryError,
    TransientDeliveryError,
    UnknownTopicError,
)

__all__ = [
    "DeliveryError",
    "DeliveryTimeoutError",
    "IdempotencyConflictError",
    "MissingExtraError",
    "Outbox",
    "OutboxError",
    "OutboxImproperlyConfigured",
    "PayloadTooLargeError",
    "PermanentDeliveryError",
    "TransientDeliveryError",
    "UnknownTopicError",
    "outbox",
]
