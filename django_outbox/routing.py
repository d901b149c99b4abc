"""Which transport serves a topic.

The reserved email topic always goes to the built-in email transport. Otherwise explicit
``OUTBOX["ROUTES"]`` win (first matching pattern, in the order written); a topic no route
names falls back to the local ``@outbox.handler`` functions. Patterns use shell wildcards
(``orders.*``, ``*.created``), matched case-sensitively.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.core.signals import setting_changed

from .conf import BAD_BACKEND, EMAIL_TOPIC, EMAIL_TRANSPORT, HANDLER_TRANSPORT, get_settings
from .exceptions import MissingExtraError, OutboxImproperlyConfigured, UnknownTopicError

if TYPE_CHECKING:
    from .models import Message

Handler = Callable[["Message"], object]


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern))


def matches(pattern: str, topic: str) -> bool:
    return pattern == topic or _compile(pattern).match(topic) is not None


class HandlerRegistry:
    """Local handlers by topic pattern; an exact topic beats a pattern, then the first pattern registered."""

    #: Topics whose handler ``find()`` remembers; past that it forgets them all and starts again.
    FOUND_MAX = 4096

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        # The handler transport asks for every message it delivers; matching the patterns each time cost
        # about a tenth of the worker's Python per no-op message (docs/performance.md).
        self._found: dict[str, Handler | None] = {}

    def register(self, pattern: str, func: Handler) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise TypeError("outbox.handler() needs a topic or pattern string, e.g. @outbox.handler('orders.*')")
        existing = self._handlers.get(pattern)
        if existing is not None and _qualname(existing) != _qualname(func):
            raise ValueError(
                f"Two handlers for topic pattern {pattern!r}: {_qualname(existing)} and {_qualname(func)}. "
                "Each pattern may have one handler; call the second from the first if both must run."
            )
        self._handlers[pattern] = func
        self._found = {}
        _clear_caches()

    def unregister(self, pattern: str) -> None:
        self._handlers.pop(pattern, None)
        self._found = {}
        _clear_caches()

    def find(self, topic: str) -> Handler | None:
        found = self._found
        try:
            return found[topic]
        except KeyError:
            pass
        func = self._match(topic)
        if len(found) >= self.FOUND_MAX:
            found.clear()
        found[topic] = func
        return func

    def _match(self, topic: str) -> Handler | None:
        exact = self._handlers.get(topic)
        if exact is not None:
            return exact
        for pattern, func in self._handlers.items():
            if matches(pattern, topic):
                return func
        return None

    def patterns(self) -> list[str]:
        return list(self._handlers)


def _qualname(func: Handler) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


registry = HandlerRegistry()


@functools.lru_cache(maxsize=4096)
def resolve_transport(topic: str) -> str:
    """Name of the transport that delivers ``topic``; raises ``UnknownTopicError`` if none does."""
    if topic == EMAIL_TOPIC:  # reserved: a catch-all route must not send emails elsewhere
        return EMAIL_TRANSPORT
    routes = get_settings().ROUTES
    for pattern, name in routes.items():
        if matches(pattern, topic):
            return name
    if registry.find(topic) is not None:
        return HANDLER_TRANSPORT
    raise UnknownTopicError(
        f"No route or handler serves topic {topic!r}. Register one with @outbox.handler({topic!r}) in an "
        f"app's outbox.py, or add a pattern for it to OUTBOX['ROUTES']"
        + (f" (current patterns: {', '.join(routes)})." if routes else ".")
    )


@functools.lru_cache(maxsize=4096)
def sending_transport(topic: str) -> str:
    """``resolve_transport()`` for ``send()``: also refuses a topic whose transport cannot be loaded.

    ``manage.py check`` reports such a transport (E011) and no worker starts with it, so a message
    written for it would wait for a deploy that fixes the path. Cached per topic, as
    ``resolve_transport()`` is, so the common send pays one cache lookup.
    """
    name = resolve_transport(topic)
    error = _load_error(get_settings().TRANSPORTS[name].backend)
    if error is not None:
        raise OutboxImproperlyConfigured(
            f"Topic {topic!r} is routed to transport {name!r}, which cannot be loaded: {error} "
            f"({BAD_BACKEND}; run 'manage.py check'). Nothing was written."
        )
    return name


@functools.lru_cache(maxsize=64)
def _load_error(backend: str) -> str | None:
    """Why the transport class at ``backend`` cannot be loaded, or None: imported once per setting."""
    from .transports.registry import transport_class  # the transports import models, routing must not

    try:
        transport_class(backend)
    except MissingExtraError:
        # A process that only sends need not install the transport's own dependencies (an image for web
        # servers without the broker client); the workers' check reports it (E012) and they do not start.
        return None
    except OutboxImproperlyConfigured as exc:
        return str(exc)
    return None


def _clear_caches() -> None:
    resolve_transport.cache_clear()
    sending_transport.cache_clear()
    _load_error.cache_clear()


def _clear_on_setting_change(*, setting: str, **kwargs: object) -> None:
    if setting == "OUTBOX":
        _clear_caches()


setting_changed.connect(_clear_on_setting_change, dispatch_uid="django_outbox.routing")
