"""One deadline per email over Django's SMTP backend, whose ``timeout`` bounds each socket operation only.

smtplib reads replies line by line, each ``recv()`` waiting up to the socket timeout, so a server that
sends its greeting (or any reply) one byte at a time, or keeps each answer just under the timeout,
holds a delivery thread for as long as it likes. A :class:`Watchdog` shuts down the sockets of the
email in progress once its deadline passes: the blocked read returns at once, smtplib raises, and the
transport reports the deadline. The sockets are those smtplib opens, seen through the connection class
that :func:`with_deadline` gives Django's backend (plain, ``SMTP_SSL`` and after ``STARTTLS``).

Backends other than Django's SMTP backend (and its subclasses) are used as they are: their own timeouts
apply, and ``OUTBOX["HANDLER_TIMEOUT_SECONDS"]`` bounds them from the outside.
"""

from __future__ import annotations

import smtplib
import socket
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend

from ..transports.deadlines import Watchdog, active


class _WatchedSMTP(smtplib.SMTP):
    """smtplib.SMTP whose sockets the thread's active watchdog can shut down."""

    _outbox_watchdog: Watchdog | None = None

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        watchdog = active()
        if watchdog is not None:
            timeout = watchdog.budget(timeout) or timeout
        sock: socket.socket = super()._get_socket(host, port, timeout)  # type: ignore[misc]
        self._outbox_watchdog = watchdog
        if watchdog is not None:
            watchdog.watch(sock)
        return sock

    def starttls(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        reply = super().starttls(*args, **kwargs)
        if self._outbox_watchdog is not None and self.sock is not None:
            self._outbox_watchdog.watch(self.sock)  # the TLS socket replaces the plain one
        return reply

    def close(self) -> None:
        if self._outbox_watchdog is not None:
            self._outbox_watchdog.forget(self.sock)
        super().close()


class _WatchedSMTPSSL(_WatchedSMTP, smtplib.SMTP_SSL):
    pass


_WATCHED: dict[type, type] = {smtplib.SMTP: _WatchedSMTP, smtplib.SMTP_SSL: _WatchedSMTPSSL}


_watched_backends: dict[type[SMTPBackend], type[SMTPBackend]] = {}


def _watched_backend_class(cls: type[SMTPBackend]) -> type[SMTPBackend]:
    """``cls`` with connection classes the watchdog sees; same name and module, for error messages."""
    watched = _watched_backends.get(cls)
    if watched is None:

        class Watched(cls):  # type: ignore[valid-type,misc]
            @property
            def connection_class(self) -> type:
                base: type = super().connection_class
                return _WATCHED.get(base, base)

        Watched.__name__, Watched.__qualname__, Watched.__module__ = cls.__name__, cls.__qualname__, cls.__module__
        watched = _watched_backends.setdefault(cls, Watched)
    return watched


def with_deadline(backend: BaseEmailBackend, timeout: float) -> bool:
    """Make ``backend`` obey the watchdog, if it is Django's SMTP backend; whether it does.

    Its own socket ``timeout`` (``EMAIL_TIMEOUT``, None by default: wait for ever) becomes ``timeout``
    when it has none, so no single operation waits longer than the whole email may.
    """
    if not isinstance(backend, SMTPBackend):
        return False
    if backend.timeout is None:
        backend.timeout = timeout
    backend.__class__ = _watched_backend_class(type(backend))
    return True
