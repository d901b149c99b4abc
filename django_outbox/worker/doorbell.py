"""How a worker's delivery threads are woken: one thread per ring, not all of them."""

from __future__ import annotations

import threading


class Doorbell:
    """Wake-ups shared by the delivery threads of one worker; each ring wakes one thread.

    A ``NOTIFY`` says that some transaction committed messages; one claim answers it, and a thread whose
    claim came back full rings again for a peer. Waking every thread on every ring (a plain
    ``threading.Event``) cost every wake-up one empty claim per extra thread. A ring that comes while
    every thread is busy is kept, up to one per thread, so the next thread to finish claims at once
    rather than sleep through it.
    """

    def __init__(self, threads: int) -> None:
        self._cond = threading.Condition()
        self._rings = 0
        self._limit = max(1, threads)
        self._opened = False

    def ring(self) -> None:
        with self._cond:
            self._rings = min(self._rings + 1, self._limit)
            self._cond.notify()

    def open(self) -> None:
        """Wake every thread now and let every later wait return at once: the worker is stopping."""
        with self._cond:
            self._opened = True
            self._cond.notify_all()

    def take(self) -> bool:
        """Answer a ring that is waiting, if there is one, without waiting for one."""
        with self._cond:
            return self._take()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ring and answer it; False when none came."""
        with self._cond:
            self._cond.wait_for(lambda: self._rings > 0 or self._opened, timeout)
            return self._take()

    def _take(self) -> bool:
        if self._opened:
            return True
        if self._rings:
            self._rings -= 1
            return True
        return False
