"""Calls the ``@outbox.handler`` function registered for the message's topic, in the worker process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import TransientDeliveryError
from ..routing import registry
from .base import BaseTransport

if TYPE_CHECKING:
    from ..models import Message


class HandlerTransport(BaseTransport):
    def deliver(self, message: Message) -> None:
        func = registry.find(message.topic)
        if func is None:
            raise TransientDeliveryError(
                f"no handler is registered for topic {message.topic!r} in this worker; is the app that "
                "defines it in INSTALLED_APPS, with the handler in its outbox.py?"
            )
        func(message)
