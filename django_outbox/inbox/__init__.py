"""The idempotent consumer: ``receive()`` and ``@consumer`` process a message at most once per (source, id).

``receipts`` records each receipt in the consumer's own transaction; ``checks`` warns when receipts are
kept for less time than a producer may retry. See docs/idempotency.md.
"""

from .receipts import Receipt, consumer, purge, receive

__all__ = ["Receipt", "consumer", "purge", "receive"]
