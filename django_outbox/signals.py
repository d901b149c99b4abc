"""Signals for the life of a message, sent by the worker after the outcome is stored.

Receivers run in the worker process, outside any outbox transaction; an exception in one is logged and
does not change the message.
"""

from django.dispatch import Signal

__all__ = ["message_dead", "message_delivered", "message_failed"]

#: sender=Message class, message=Message, attempt=int
message_delivered = Signal()
#: sender=Message class, message=Message, attempt=int, error=str, retry_at=datetime
message_failed = Signal()
#: sender=Message class, message=Message, attempt=int, error=str
message_dead = Signal()
