"""Deadlines of one delivery call, for the transports that make it and the worker that sets them.

Here, not in ``worker``, so that a transport never imports the worker: the worker imports transports.

``time_limit()`` (set by the worker around each delivery call) says how long the call may take, and
``time_left()`` reads it: a coroutine can be cancelled at its deadline (the handler transport).

A :class:`Watchdog` is a deadline for blocking socket code that only knows per-operation timeouts
(smtplib, redis-py). Such clients wait up to their timeout for each ``recv()``, so a peer that sends a byte now and then
holds them for ever. A :class:`Watchdog` is armed for one delivery call; the client's sockets are
registered with it as they are made (by a connection class of the transport's own), and when the
deadline passes it shuts them down: the blocked read returns at once and the client raises, and the
transport, seeing ``expired()``, reports the deadline rather than a dropped connection.
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
import time
from collections.abc import Iterator

#: The deadline of the delivery call running in this context: (time.monotonic() deadline, whole limit).
_deadline: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "django_outbox_call_deadline", default=None
)


_UNLIMITED = contextlib.nullcontext()


def time_limit(seconds: float | None) -> contextlib.AbstractContextManager[None]:
    """Tell the delivery call made in this block how long it may take (None: no limit).

    A thread cannot be stopped, so ``BoundedCaller`` can only abandon a hung call; a coroutine can be
    cancelled, so the handler transport reads this to cancel an async handler at its deadline. It is
    also the only bound in ``relay_all()``, which has no helper thread.

    No limit where none is set already (the worker's default) changes nothing: a shared no-op block,
    not a generator and a context variable's set and reset for every message.
    """
    if seconds is None and _deadline.get() is None:
        return _UNLIMITED
    return _limited(seconds)


@contextlib.contextmanager
def _limited(seconds: float | None) -> Iterator[None]:
    token = _deadline.set(None if seconds is None else (time.monotonic() + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left() -> tuple[float, float] | None:
    """(seconds left, the whole limit) for the delivery call running here, or None without a limit."""
    deadline = _deadline.get()
    if deadline is None:
        return None
    return max(0.0, deadline[0] - time.monotonic()), deadline[1]


_active = threading.local()  # the watchdog of the delivery call this thread is making, if any


def active() -> Watchdog | None:
    """The watchdog armed by this thread, for connection classes that register their sockets."""
    watchdog: Watchdog | None = getattr(_active, "watchdog", None)
    return watchdog


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
