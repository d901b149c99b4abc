"""Builds the configured transports lazily, one set per worker thread."""

from __future__ import annotations

import logging

from django.utils.module_loading import import_string

from ..conf import get_settings
from ..exceptions import OutboxImproperlyConfigured
from .base import BaseTransport

logger = logging.getLogger("django_outbox.transports")


def transport_class(backend: str) -> type[BaseTransport]:
    try:
        cls = import_string(backend)
    except OutboxImproperlyConfigured:  # MissingExtraError: the message names the extra to install
        raise
    except Exception as exc:  # ImportError, ValueError (".x"), or whatever the module raised on import
        raise OutboxImproperlyConfigured(
            f"Cannot import transport backend {backend!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseTransport)):
        raise OutboxImproperlyConfigured(
            f"Transport backend {backend!r} is not a subclass of django_outbox.transports.BaseTransport."
        )
    return cls


class TransportSet:
    """The transports one thread uses; not shared, so a transport may keep unlocked connections."""

    def __init__(self) -> None:
        self._open: dict[str, BaseTransport] = {}

    def get(self, name: str) -> BaseTransport:
        transport = self._open.get(name)
        if transport is None:
            config = get_settings().TRANSPORTS[name]
            transport = transport_class(config.backend)(name=name, options=config.options)
            self._open[name] = transport
        return transport

    def detach(self) -> TransportSet:
        """Hand the open transports over to a new set and start afresh (after a call on them hung)."""
        stale = TransportSet()
        stale._open, self._open = self._open, {}
        return stale

    def close(self) -> None:
        for name, transport in self._open.items():
            try:
                transport.close()
            except Exception:
                logger.exception("closing transport %r failed", name)
        self._open.clear()
