"""Destinations behind one interface; each backend is chosen by dotted path in ``OUTBOX["TRANSPORTS"]``."""

from .base import BaseTransport, BatchTransport

__all__ = ["BaseTransport", "BatchTransport"]
