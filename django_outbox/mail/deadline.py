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
import threading
import time
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend

_active = threading.local()  # the watchdog of the email this thread is sending, if any


class Watchdog:
    """Shuts down the watched sockets when the armed deadline passes; one per transport (per thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer: threading.Timer | None = None
        self._deadline: float | None = None
        self._generation = 0  # which arming a timer belongs to, so a late timer of an earlier email does nothing
        self.fired = False

    def arm(self, seconds: float) -> None:
        """Start the clock of one email; sockets already watched (a reused connection) stay watched."""
        self.disarm()
        with self._lock:
            self.fired = False
            self._generation += 1
            self._deadline = time.monotonic() + seconds
            self._timer = threading.Timer(seconds, self._fire, args=(self._generation,))
            self._timer.daemon = True
            self._timer.name = "outbox-email-deadline"
            self._timer.start()
        _active.watchdog = self

    def disarm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._deadline = None, None
        _active.watchdog = None

    def budget(self, timeout: float | None) -> float | None:
        """``timeout``, cut to the time the email has left (for connecting, before a socket exists)."""
        deadline = self._deadline
        if deadline is None:
            return timeout
        left = max(deadline - time.monotonic(), 0.001)
        return left if timeout is None else min(timeout, left)

    def expired(self) -> bool:
        """Whether the deadline has fired or is (all but) reached: a socket timeout then is the deadline's."""
        deadline = self._deadline
        return self.fired or (deadline is not None and deadline - time.monotonic() < 0.05)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.fired:
                self._shut(sock)

    def forget(self, sock: socket.socket | None) -> None:
        """Stop watching ``sock``, before it is closed (so a late timer never touches a reused descriptor)."""
        with self._lock:
            self._sockets = [s for s in self._sockets if s is not sock and s.fileno() != -1]

    def _fire(self, generation: int) -> None:
        with self._lock:
            if self._timer is None or generation != self._generation:
                return  # disarmed (or armed again) meanwhile
            self.fired = True
            for sock in self._sockets:
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            # the plain socket's shutdown, also for an SSL socket: no TLS alert, just wake the reader
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


class _WatchedSMTP(smtplib.SMTP):
    """smtplib.SMTP whose sockets the thread's active watchdog can shut down."""

    _outbox_watchdog: Watchdog | None = None

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        watchdog: Watchdog | None = getattr(_active, "watchdog", None)
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
