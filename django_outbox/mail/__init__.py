"""Email through the outbox: a Django email backend, the worker's email transport and browser links."""

from .backend import EmailBackend, ReusedBrowserLinkError
from .links import browser_link

__all__ = ["EmailBackend", "ReusedBrowserLinkError", "browser_link"]
