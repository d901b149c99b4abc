"""Waking idle workers the moment a producing transaction commits: the listening side (``LISTEN``).

Workers ``LISTEN`` on a dedicated connection and turn each notification into a ring of the doorbell;
the sending side (one ``NOTIFY`` per committed transaction that sent messages) is ``store.notify``.
Elsewhere than PostgreSQL, or with ``OUTBOX["NOTIFY"] = False``, workers poll, so a lost notification
never delays delivery by more than the poll interval.

A pooler in transaction pooling (PgBouncer) cannot keep a ``LISTEN``: the session that registered it goes
back to the pool after the statement, and its notifications reach nobody. ``OUTBOX["LISTEN_DATABASE"]``
names another alias, typically the same server reached directly, used only for the listener's one
connection (sending stays on the caller's connection, through the pooler: ``NOTIFY`` is transactional
and works there). Whether a ``LISTEN`` hears is not guessed from settings but tried: the listener sends
itself a notification on a second connection after each connect (``hears_itself``).
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..conf import get_settings

logger = logging.getLogger("django_outbox.wakeup")


#: How long a listener waits for its own probe notification before it calls its connection deaf.
PROBE_TIMEOUT = 2.0


def listen_alias(alias: str) -> str:
    """The alias the listener of ``alias``'s workers connects to."""
    return get_settings().LISTEN_DATABASE or alias


def raw_params(alias: str) -> dict[str, Any]:
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)  # Django's, for its own connections
    params.pop("context", None)
    return params


def hears_itself(listening: Any, notify_alias: str, *, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the psycopg connection ``listening`` hears a NOTIFY sent through ``notify_alias``.

    It LISTENs on a channel of its own, and a second connection (made like the workers' own, through
    whatever pooler is in the way) notifies it. Through a pooler in transaction pooling the notification
    goes to whichever client holds the server session then, so it is not heard.
    """
    import psycopg

    channel = f"django_outbox_probe_{secrets.token_hex(6)}"
    listening.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
    try:
        with psycopg.connect(**raw_params(notify_alias), autocommit=True) as notifier:
            notifier.execute("SELECT pg_notify(%s, '')", [channel])
        return any(n.channel == channel for n in listening.notifies(timeout=timeout, stop_after=1))
    finally:
        listening.execute(psycopg.sql.SQL("UNLISTEN {}").format(psycopg.sql.Identifier(channel)))


class Listener(threading.Thread):
    """LISTENs on its own autocommit connection and calls ``wake()`` on every notification.

    A dropped connection (database restart, network cut) is re-opened with capped backoff; after each
    reconnect ``wake()`` is called once, since notifications sent while we were away are lost. A
    connection that does not hear its own probe (a pooler in transaction pooling) is closed with a
    warning, once, and the listener gives up: the workers poll, and ``connected`` stays clear, which
    tells the delivery threads not to wait for wake-ups.

    It waits on its connection's socket and on a pipe of its own at once: ``stop()`` writes to the pipe
    (safe from a signal handler), so a stopping worker's listener closes its connection and ends at once,
    rather than at the end of a timed wait.
    """

    #: Longest wait on the socket before the connection is polled anyway (a lost wake-up costs no more).
    IDLE_POLL = 5.0

    def __init__(
        self, alias: str, wake: Callable[[], None], stopping: Callable[[], bool], *, poll_interval: float | None = None
    ) -> None:
        super().__init__(name="outbox-listener", daemon=True)
        self.alias = alias
        self.poll_interval = poll_interval
        self.wake = wake
        self.stopping = stopping
        self.connected = threading.Event()
        self.deaf = False  # its connection did not hear its own probe: the workers poll
        self._stop_read, self._stop_write = os.pipe()
        os.set_blocking(self._stop_write, False)
        self._stopped = threading.Event()
        self._pipe_lock = threading.RLock()  # re-entrant: stop() may run in a signal handler, over itself
        self._pipe_open = True

    def stop(self) -> None:
        """Ask the thread to end now: it is woken from its wait on the socket, or from its reconnect delay."""
        self._stopped.set()
        with self._pipe_lock:
            if self._pipe_open:
                try:
                    os.write(self._stop_write, b"x")
                except BlockingIOError:  # the pipe is full: it was asked already
                    pass

    def _ending(self) -> bool:
        return self._stopped.is_set() or self.stopping()

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.connected.clear()
            with self._pipe_lock:
                self._pipe_open = False
                os.close(self._stop_read)
                os.close(self._stop_write)

    def _run(self) -> None:
        import psycopg

        settings = get_settings()
        channel = settings.NOTIFY_CHANNEL
        target = listen_alias(self.alias)
        delay = 0.1
        while not self._ending():
            try:
                with psycopg.connect(**raw_params(target), autocommit=True) as conn:
                    if not hears_itself(conn, self.alias):
                        self.deaf = True
                        logger.warning(
                            "the outbox listener on database %r does not hear notifications (a connection "
                            "pooler in transaction pooling?): workers poll every %gs instead of waking at "
                            "commit. Set OUTBOX['LISTEN_DATABASE'] to an alias that reaches the server "
                            "directly (docs/deploying.md).",
                            target,
                            self.poll_interval or settings.POLL_INTERVAL_SECONDS,
                        )
                        return
                    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
                    self.connected.set()
                    self.wake()
                    delay = 0.1
                    # timeout=0 hands over what psycopg holds already (notifications that came with a
                    # statement's reply, the LISTEN's) and what the socket holds, without waiting
                    for _ in conn.notifies(timeout=0):
                        self.wake()
                    pgconn = conn.pgconn
                    while not self._ending():
                        readable, _, _ = select.select([conn.fileno(), self._stop_read], [], [], self.IDLE_POLL)
                        if self._stop_read in readable:
                            return
                        if not readable:
                            continue
                        # No statement runs on this connection from here on, so what arrives is read off
                        # the socket by libpq directly: psycopg's notifies() generator, its wait and its
                        # Notify objects cost a wake-up about 80 us of the ~2 ms (docs/performance.md).
                        # A closed connection raises here, and is re-opened like any failure.
                        pgconn.consume_input()
                        while pgconn.notifies() is not None:
                            self.wake()
            except Exception as exc:  # any failure means: reconnect, and poll meanwhile
                self.connected.clear()
                if self._ending():
                    return
                logger.warning("outbox listener lost its connection (%s); reconnecting in %.1fs", exc, delay)
                self._stopped.wait(delay)
                delay = min(delay * 2, 10.0)
