"""Calls the ``@outbox.handler`` function registered for the message's topic, in the worker process.

A handler may be ``async def``, or return any awaitable: it is awaited through asgiref's
``async_to_sync``, as Django itself runs async code from sync code. That matters for the ORM: the
async ORM hands each query to ``sync_to_async(thread_sensitive=True)``, and under ``async_to_sync``
those run back on the calling thread, with its database connection. In a delivery thread that is the
worker's own connection (no transaction is open while a handler runs); in ``relay_all()`` it is the
caller's, so an async handler sees the test's uncommitted rows, as a sync one does. Called from a thread
that ``sync_to_async`` started, ``async_to_sync`` runs the coroutine on that outer event loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from asgiref.sync import async_to_sync

from ..exceptions import DeliveryTimeoutError, TransientDeliveryError
from ..routing import registry
from .base import BaseTransport
from .deadlines import time_left

if TYPE_CHECKING:
    from ..models import Message


@dataclass(frozen=True)
class HandlerOptions:
    """The handler transport takes no options: what it calls is registered with ``@outbox.handler``."""


class HandlerTransport(BaseTransport):
    options_class: ClassVar[type | None] = HandlerOptions

    def deliver(self, message: Message) -> None:
        func = registry.find(message.topic)
        if func is None:
            raise TransientDeliveryError(
                f"no handler is registered for topic {message.topic!r} in this worker; is the app that "
                "defines it in INSTALLED_APPS, with the handler in its outbox.py?"
            )
        result = func(message)
        if inspect.isawaitable(result):
            wait_for(result)


def wait_for(awaitable: Awaitable[object]) -> None:
    """Await a handler's result from this (sync) thread; its exception is the attempt's failure.

    Under a time limit (``HANDLER_TIMEOUT_SECONDS``) the coroutine is cancelled at the deadline, so
    unlike a hung sync handler nothing keeps running: it cannot deliver late, nor hold the process
    at exit.
    """
    started = False
    limit = time_left()

    async def run() -> None:
        nonlocal started
        started = True
        if limit is None:
            await awaitable
            return
        left, whole = limit
        scope = asyncio.timeout(left)
        try:
            async with scope:
                await awaitable
        except TimeoutError as exc:
            if not scope.expired():
                raise  # the handler's own TimeoutError: a failure like any other
            raise DeliveryTimeoutError(
                f"delivery timed out after {whole:g} s (OUTBOX['HANDLER_TIMEOUT_SECONDS']); the async "
                "handler was cancelled"
            ) from exc

    try:
        async_to_sync(run)()
    finally:
        if not started and inspect.iscoroutine(awaitable):
            awaitable.close()  # never run (e.g. no event loop could be had here): no "never awaited" warning


__all__ = ["HandlerTransport"]
